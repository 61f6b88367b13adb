// Package perl finds the Perl 5 interpreter in other processes and names
// their Perl frames.
//
// It reads only what the process's own files and memory say: libperl's
// (or a static perl binary's) exported symbols (PL_curinterp,
// Perl_runops_standard, PL_revision, PL_version, PL_subversion), a
// per-version table of the structure offsets the eBPF walker follows and
// the namer reads (interpreter, stack info, context, COP, CV, GV, stash,
// HEK), and those objects read from /proc/PID/mem when a frame is named.
// It never attaches to or pauses a process.
//
// Only builds with MULTIPLICITY (Debian's thread-multi) are supported:
// their interpreter is one struct that PL_curinterp points at, the main
// thread's. Everything read from a process is untrusted: every parser here
// is bounded and has a fuzz target, and a value that does not make sense
// is an error, never a guessed name.
package perl
