// Package symbolize names the frames of sampled stacks on the host: kernel
// addresses from kallsyms, native code from ELF .symtab/.dynsym (demangled
// C++ and Rust) with DWARF line tables where present, and Go code from the
// pclntab.
//
// A Symbolizer identifies files by content (elfx.FileID), so a library
// mapped by many processes is read once, and keeps three bounded caches:
// files known from Open, the symbol data of recently used files, and the
// frames of recently named (file, offset) pairs. Every drop is counted in
// Stats.
package symbolize
