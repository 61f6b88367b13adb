// Package jvm names the Java frames of HotSpot JVMs (JDK 8 and later)
// without the JVM's cooperation: no agent, no flags, no attach. Layouts
// come from the tables HotSpot exports for its serviceability agent
// (gHotSpotVMStructs, gHotSpotVMTypes, gHotSpotVMIntConstants,
// gHotSpotVMLongConstants, with the gHotSpotVM*Offset and *ArrayStride
// variables that describe their entries), found in libjvm.so's symbols and
// read from the process's memory, so a new JDK is at most a data change.
// Only the x86-64 interpreter frame slots, which the tables do not export,
// come from a small per-version table (interpreterFrames, from each JDK's
// frame_x86.hpp; checked against the exported sender and last sp slots).
//
// Find reads a process's JVM layout and the addresses the eBPF walker
// needs (Kernel). A Namer turns the frames the walker reported into
// method names, source files, lines, inlined methods and tiers, checking
// that what it reads is still what the sample saw (compile id, bytecode
// range) and failing with ErrStale or ErrUnreadable otherwise.
//
// What differs between JDKs and is handled from the tables (seen on JDK 17
// and 25; the other versions named are from their sources, untested):
//   - CodeBlob: _code_begin (a pointer, JDK 9 to 22) or _code_offset (an
//     int, JDK 8 and 23+); _frame_complete_offset an int or, from JDK 23,
//     an int16; the blob's kind by CodeBlob::_kind (JDK 23+) or its name
//     ("nmethod", "native nmethod").
//   - nmethod: _method on CompiledMethod (JDK 9 to 22) or nmethod;
//     PcDescs and scopes inside the blob, or in _immutable_data (JDK 24+);
//     metadata at _metadata_offset, or after the relocations in the
//     CodeBlob's _mutable_data (JDK 25+).
//   - ConstMethod flags: _flags (u2) or _flags._flags (u4, JDK 25) with
//     ConstMethod::_has_linenumber_table or
//     ConstMethodFlags::_misc_has_linenumber_table.
//   - The source file index in ConstantPool (JDK 9+) or InstanceKlass.
//   - Compressed streams (line tables, scopes): Pack200's UNSIGNED5 with
//     192 low bytes before JDK 20, with the zero byte excluded (191 low
//     bytes, every byte biased by one) from JDK 20 (JDK-8292758).
//   - The Java major: JDK_Version::_current._major where exported (JDK 8's
//     HotSpot calls itself 25.x), else Abstract_VM_Version's.
package jvm
