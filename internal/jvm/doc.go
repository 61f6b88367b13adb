// Package jvm names the Java frames of HotSpot JVMs (JDK 8 and later)
// without the JVM's cooperation: no agent, no flags, no attach. Layouts
// come from the tables HotSpot exports for its serviceability agent
// (gHotSpotVMStructs, gHotSpotVMTypes, gHotSpotVMIntConstants,
// gHotSpotVMLongConstants), read from the process's memory, so a new JDK
// is at most a data change. Only the x86-64 interpreter frame slots, which
// the tables do not export, come from a small per-version table.
//
// Find reads a process's JVM layout and the addresses the eBPF walker
// needs (Kernel); a Namer turns the frames the walker reported into
// method names, source files, lines and inlined methods.
package jvm
