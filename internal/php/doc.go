// Package php finds the Zend Engine (PHP 8) in other processes and names
// their PHP frames.
//
// It reads only what the process's own files and memory say: the binary's
// exported symbols (executor_globals, execute_ex), its version (the
// "X-Powered-By: PHP/x.y.z" string every SAPI carries, checked against the
// module API number "API2022...,NTS"), a per-version table of the few
// structure offsets the eBPF walker follows and the namer reads, and
// zend_function and zend_string objects read from /proc/PID/mem when a
// frame is named. It never attaches to or pauses a process.
//
// Everything read from a process is untrusted: every parser here is
// bounded and has a fuzz target, and a value that does not make sense is
// an error, never a guessed name.
package php
