// Package ruby finds CRuby 3.x (the YARV virtual machine) in other
// processes and names their Ruby frames.
//
// It reads only what the process's own files and memory say: libruby's
// exported symbols (ruby_current_vm_ptr, the thread-local ruby_current_ec,
// rb_vm_exec, ruby_version), the call from rb_vm_exec into the VM loop
// (vm_exec_core, a local function) and that function's extent from the
// file's .eh_frame_hdr, a per-version table of the structure offsets the
// eBPF walker follows and the namer reads, and instruction sequences read
// from /proc/PID/mem when a frame is named. It never attaches to or pauses
// a process.
//
// Everything read from a process is untrusted: every parser here is
// bounded and has a fuzz target, and a value that does not make sense is
// an error, never a guessed name.
package ruby
