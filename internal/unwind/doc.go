// Package unwind derives compact unwind tables from an ELF file's call frame
// information (.eh_frame and .debug_frame) for the eBPF unwinder, which
// binary-searches the rows by address and applies them to unwind user stacks
// that lack frame pointers.
//
// Every parser here reads untrusted bytes (any process may map any file): all
// counts, lengths and state depths are capped, and hostile input yields an
// error or CFAUnknown rows, never a panic. Functions keep no state, so all are
// safe for concurrent use; a Table is immutable once returned.
package unwind
