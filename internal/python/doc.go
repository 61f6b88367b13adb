// Package python finds CPython interpreters in other processes and names
// their Python frames.
//
// It reads only what the process's own files and memory say: the
// interpreter's ELF symbols (_PyRuntime, or interp_head on 3.6), its
// version from its file name, the per-version layouts of the structures
// the eBPF walker follows (a table, cross-checked with the interpreters'
// own _Py_DebugOffsets from 3.13 on), and code objects read from
// /proc/PID/mem when a frame is named. It never attaches to or pauses a
// process.
//
// Everything read from a process is untrusted: every parser here is
// bounded and has a fuzz target, and a value that does not make sense is
// an error, never a guessed name.
package python
