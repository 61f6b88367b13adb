// Package symbolize names the frames of sampled stacks on the host: kernel
// addresses from kallsyms, native code from ELF symbols (demangled C++ and
// Rust) and DWARF, and Go code from the pclntab.
//
// Native names come from the best source a file has: a separate debug file
// (found by build id or .gnu_debuglink, under /usr/lib/debug inside the
// process's root and in Options.DebugDirs), the file's own .symtab, its
// MiniDebugInfo (.gnu_debugdata), then .dynsym. DWARF (plain, zlib or zstd
// compressed, or legacy .zdebug) gives source lines and inline chains: one
// address becomes several lines, innermost first. A file's DWARF is indexed
// by compile-unit ranges only; a unit's entries and line program are parsed
// on the first lookup inside it and kept in a bounded per-file cache.
// Function names are simplified as pprof shows them (no parameter lists or
// template arguments); the mangled name is kept as the system name.
//
// Symbol sources are read in place: symbol tables, the pclntab and plain
// DWARF are parsed from a read-only mapping of the file, whose pages are
// the kernel's page cache, not the heap. Only derived data is the agent's:
// the sorted symbol index and parsed units in the heap, compressed DWARF
// inflated into read-only mappings outside the heap (so the collector's
// heap goal does not double it), spilled to an unlinked temporary file
// where the temporary directory is on disk (its pages leave RSS once read,
// each interval) and anonymous memory otherwise, and Options.MaxSymbolBytes
// bounds all of it together with the caches; what one file may inflate is
// capped (Options.MaxInflateBytes). A unit is read through a dwarf.Data
// over that unit alone, so only its abbreviations are ever parsed.
//
// A file is opened once: Open returns a Handle, a counted reference that
// keeps the file open by descriptor until released, and symbol data is
// loaded through that descriptor, never through the /proc path it was
// first opened by (which dies with its process). Files are identified by
// content (elfx.FileID), so a library mapped by many processes is read
// once. Every drop is counted in Stats.
package symbolize
