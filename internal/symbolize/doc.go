// Package symbolize names the frames of sampled stacks on the host: kernel
// addresses from kallsyms, native code from ELF symbols (demangled C++ and
// Rust) and DWARF, and Go code from the pclntab.
//
// Native names come from the best source a file has: a separate debug file
// (found by build id or .gnu_debuglink, under /usr/lib/debug inside the
// process's root and in Options.DebugDirs), the file's own .symtab, its
// MiniDebugInfo (.gnu_debugdata), then .dynsym. DWARF (plain, zlib or zstd
// compressed, or legacy .zdebug) gives source lines and inline chains: one
// address becomes several frames, innermost first. A file's DWARF is indexed
// by compile-unit ranges only; a unit's entries and line program are parsed
// on the first lookup inside it and kept in a bounded per-file cache.
//
// A Symbolizer identifies files by content (elfx.FileID), so a library
// mapped by many processes is read once, and keeps three bounded caches:
// files known from Open, the symbol data of recently used files, and the
// frames of recently named (file, offset) pairs. Every drop is counted in
// Stats.
package symbolize
