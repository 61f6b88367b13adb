// Package support holds Sonde's eBPF programs: the C sources in ebpf/, the
// objects compiled from them and the Go bindings bpf2go generates, all
// committed. The tracer package owns loading them; nothing else should.
//
// The programs read the CPU's registers and signal frames (ebpf/arch.h), so
// the object that is loaded is compiled for the architecture it runs on:
// x86-64 (sonde_x86_bpfel.*, amd64) or aarch64 (sonde_arm64_bpfel.*,
// arm64). Other architectures get a build of the same sources for BPF
// without an architecture (sonde_bpfel.*), only so that the Go types exist
// and the packages above build there; the tracer refuses to load it.
//
// Regenerate with `make generate` (clang-19, llvm-strip-19); CI checks the
// committed objects match their sources.
package support

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target amd64 -type sample_record -type task_record -type counter -type record_type -type sample_flags -type unwind_row -type mapping_key -type mapping_info -type cfa_type -type fp_rule -type row_bits -type pid_stats -type offcpu_end_record -type offcpu_end_flags -type python_proc -type jvm_proc -type jvm_heap -type runtime_id -type jvm_frame_kind -type v8_proc -type v8_frame_kind -type php_proc -type php_frame_kind -type ruby_proc -type ruby_frame_kind -type perl_proc -type perl_frame_kind -type limits -type pc_flags -type stack_snapshot -type known_proc -type mapping_info_flags -type row_page Sonde ebpf/sonde.c -- -I./ebpf
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target arm64 -type sample_record -type task_record -type counter -type record_type -type sample_flags -type unwind_row -type mapping_key -type mapping_info -type cfa_type -type fp_rule -type row_bits -type pid_stats -type offcpu_end_record -type offcpu_end_flags -type python_proc -type jvm_proc -type jvm_heap -type runtime_id -type jvm_frame_kind -type v8_proc -type v8_frame_kind -type php_proc -type php_frame_kind -type ruby_proc -type ruby_frame_kind -type perl_proc -type perl_frame_kind -type limits -type pc_flags -type stack_snapshot -type known_proc -type mapping_info_flags -type row_page Sonde ebpf/sonde.c -- -I./ebpf
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel -tags !386,!amd64,!arm64 -type sample_record -type task_record -type counter -type record_type -type sample_flags -type unwind_row -type mapping_key -type mapping_info -type cfa_type -type fp_rule -type row_bits -type pid_stats -type offcpu_end_record -type offcpu_end_flags -type python_proc -type jvm_proc -type jvm_heap -type runtime_id -type jvm_frame_kind -type v8_proc -type v8_frame_kind -type php_proc -type php_frame_kind -type ruby_proc -type ruby_frame_kind -type perl_proc -type perl_frame_kind -type limits -type pc_flags -type stack_snapshot -type known_proc -type mapping_info_flags -type row_page Sonde ebpf/sonde.c -- -I./ebpf

// The test programs of package tracer (ebpf/testrun.c): BPF_PROG_TEST_RUN
// harnesses of the unwinder's functions, generated into tracer's tests.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target amd64 -go-package tracer -output-dir ../tracer -output-suffix _test -type testrun_io testrun ebpf/testrun.c -- -I./ebpf
// The same, built as for aarch64 (arch.h) for any little-endian host: the
// aarch64 rules run in this machine's kernel too.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -D__TARGET_ARCH_arm64" -target bpfel -go-package tracer -output-dir ../tracer -output-suffix _test -type testrun_io testrunArm64 ebpf/testrun.c -- -I./ebpf
