// Package v8 names the JavaScript frames of V8 (Node.js 18 to 26: V8 10.2
// to 14.6) without the process's cooperation: no --perf-basic-prof, no
// --interpreted-frames-native-stack, no inspector. Layouts come from the
// post-mortem metadata V8 builds into Node (the v8dbg_* symbols, whose
// values are the offsets, instance types and frame constants), read from
// the binary, and the binary's V8 version (v8::internal::Version); what
// the metadata lacks comes from a small per-V8-major table (versions),
// checked against the metadata where both speak. Node's official builds
// and Debian's do not compress pointers (v8dbg_TaggedSize is 8): a Smi's
// value is in its high 32 bits.
//
// Find locates V8 in a process and what the eBPF walker needs (Kernel,
// whose documentation is the walker's contract; Kernel.Walk is its
// executable specification, run by the live tests on node processes
// stopped with ptrace). A Namer turns the frames the walker reported into
// function names, script names, lines, inlined functions and tiers
// (interpreted, baseline, maglev, turbofan, builtin, stub), checking that
// what it reads still matches the sample and failing with ErrStale or
// ErrUnreadable otherwise.
//
// What differs between V8s and is handled here:
//   - The embedded builtins run from the binary's text and, where V8
//     remaps them next to its code space for short calls (seen on Node 20
//     to 26, depending on where the code range lands), from a second
//     mapping of the same file pages.
//   - Code: V8 10 keeps instructions inside the Code object; V8 11 and
//     later in an InstructionStream that points back to its Code.
//   - SharedFunctionInfo, BytecodeArray, Code and DeoptimizationData
//     fields move between majors; V8 13 wraps the deoptimization data's
//     function in a SharedFunctionInfoWrapper.
//   - Source position tables: V8 14 encodes code offsets unsigned with a
//     statement flag where earlier ones zig-zag encode them (the sign is
//     the flag).
//
// A Sparkplug (baseline) frame's line comes from its code's bytecode
// offset table, stepped through with the bytecodes' sizes (Ignition's
// Bytecodes::kBytecodeSizes, read from the binary's symbols).
//
// A script's source behind a C++ resource (an external string: Node's own
// modules, and on Node 26 a script read through the compile cache) is read
// through the pointer to its characters the string caches; an uncached one
// leaves its script without lines (line 0).
//
// What is not named: TurboFan and Maglev record
// positions sparsely without a profiler attached, and for code compiled
// on stack replacement the call sites of inlined functions are recorded
// at the enclosing loop: those lines are V8's own.
package v8
