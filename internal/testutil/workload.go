package testutil

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// workloadDir is the directory of the workload sources, found from this
// file's own path so tests in any package can build them.
func workloadDir(tb testing.TB) string {
	tb.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		tb.Fatal("cannot locate internal/testutil")
	}
	return filepath.Join(filepath.Dir(file), "workloads")
}

// Workloads with a known call chain, built from source by the test.
const (
	// CChain: C, frame pointers, no inlining: main -> a -> b -> c (c burns CPU).
	CChain = "cchain"
	// Syscalls: C: main -> spin_syscalls -> syscall(getppid), mostly in the kernel.
	Syscalls = "syscalls"
	// GoChain: Go: main.main -> main.alpha -> main.beta -> main.gamma.
	GoChain = "gochain"
	// QSort: C, no frame pointers: main -> b -> qsort -> (libc) -> c.
	QSort = "qsort"
	// Throw: C++, no frame pointers: main -> a -> b -> c; c throws to a.
	Throw = "throw"
	// Signal: C, no frame pointers: a SIGPROF handler burns CPU on top of
	// main -> a -> b.
	Signal = "signal"
	// Recurse: C, no frame pointers: main -> rec x 200 -> burn.
	Recurse = "recurse"
	// DLOpen: C, no frame pointers: main dlopens DLOpenLib (argv[1]) and
	// calls lib_outer -> lib_inner there.
	DLOpen = "dlopen"
	// DLOpenLib: the shared library DLOpen loads.
	DLOpenLib = "dlopenlib.so"
	// MapFiles: C: dlopens argv[1] (DLOpenLib) and maps each further
	// argument PROT_EXEC without touching it, prints "ready", waits for a
	// line on stdin, then burns CPU: main -> lib_outer -> lib_inner.
	MapFiles = "mapfiles"
	// DLSwap: C, no frame pointers: alternates DLSwapA (argv[1]) and
	// DLSwapB (argv[2]), argv[3] ms each: dlopen, main -> run ->
	// a_outer -> a_inner (b_ in B), dlclose.
	DLSwap = "dlswap"
	// DLSwapA and DLSwapB: the libraries DLSwap alternates.
	DLSwapA = "dlswapa.so"
	DLSwapB = "dlswapb.so"
	// GoLeaf: Go: main.main -> main.alpha -> main.beta -> main.leaf, where
	// leaf is frameless: only the pclntab's SP deltas find beta.
	GoLeaf = "goleaf"
	// GoSys: Go whose collector runs all the time, much of it on the
	// system stack through runtime.systemstack (see the source).
	GoSys = "gosys"
	// Fixed: C: a fixed amount of CPU work (argv[1] iterations), then exit.
	Fixed = "fixed"
	// CChainNoFP: cchain.c at -O2 without frame pointers: only CFI unwinds it.
	CChainNoFP = "cchain-nofp"
	// CChainStripped: CChainNoFP with .symtab stripped; names come from
	// .dynsym (-rdynamic), frames from .eh_frame.
	CChainStripped = "cchain-stripped"
	// GoCgo: Go and C (cgo, the C half without frame pointers) calling each
	// other: main.main -> main.goOuter -> (cgo) c_outer -> c_middle ->
	// (export) main.goCallback -> main.goInner -> a leaf that burns CPU:
	// the C function c_leaf, through cgo again, or with the argument "go"
	// the Go function main.goLeaf. BuildWorkloadARM64 builds it static.
	GoCgo = "gocgo"
	// GoCall: Go calling C through cgo, one way only: main.main ->
	// main.goOuter -> (cgo) c_outer -> c_leaf, which burns CPU; the C half
	// without frame pointers. BuildWorkloadARM64 builds it static.
	GoCall = "gocall"
	// VDSOLoop: C: main -> loop -> tick -> clock_gettime, which spends its
	// time in the vDSO.
	VDSOLoop = "vdsoloop"
	// GoTime: Go: main.main -> main.tick -> time.Now, which spends its time
	// in the vDSO, called on the system stack.
	GoTime = "gotime"
	// Threads: C: a thread named argv[1] burns CPU (spin -> burn) while the
	// main thread waits in pthread_join.
	Threads = "threads"

	// OffCPUSleep: C: main -> a -> b -> nanosleep(200 ms), after a little CPU
	// in main -> spin; logs each sleep to argv[1] if given (see the source).
	OffCPUSleep = "offcpusleep"
	// PipeWait: C: main -> reader -> read on a pipe a child writes every 100 ms.
	PipeWait = "pipewait"
	// PingPong: C: two processes bounce a byte over two pipes for argv[1]
	// seconds, on CPU argv[2] if given, and print "round-trips-per-second N".
	PingPong = "pingpong"
)

// Flags without frame pointers, keeping calls as calls so the chain is real.
var noFramePointers = []string{"-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline"}

// WorkloadSource returns the path of a C workload's source file.
func WorkloadSource(tb testing.TB, name string) string {
	tb.Helper()
	return filepath.Join(workloadDir(tb), name+".c")
}

// BuildWorkload builds the named workload into a temporary directory and
// returns the binary's path.
func BuildWorkload(tb testing.TB, name string) string {
	tb.Helper()
	dir := workloadDir(tb)
	switch name {
	case CChain, Syscalls, Fixed, OffCPUSleep, PipeWait, PingPong:
		return BuildC(tb, name, []string{"-O0", "-g", "-fno-omit-frame-pointer", "-fno-inline"}, filepath.Join(dir, name+".c"))
	case Threads:
		return BuildC(tb, name, []string{"-O0", "-g", "-fno-omit-frame-pointer", "-fno-inline", "-pthread"}, filepath.Join(dir, name+".c"))
	case CChainNoFP:
		return BuildC(tb, name, noFramePointers, filepath.Join(dir, CChain+".c"))
	case CChainStripped:
		bin := BuildC(tb, name, append([]string{"-rdynamic"}, noFramePointers...), filepath.Join(dir, CChain+".c"))
		run(tb, exec.Command(RequireTool(tb, "strip"), "--strip-all", bin))
		return bin
	case QSort, Signal, Recurse, DLOpen, DLSwap, MapFiles:
		return BuildC(tb, name, noFramePointers, filepath.Join(dir, name+".c"))
	case Throw:
		return BuildCXX(tb, name, noFramePointers, filepath.Join(dir, name+".cc"))
	case DLOpenLib, DLSwapA, DLSwapB:
		return BuildC(tb, name, append([]string{"-shared", "-fPIC"}, noFramePointers...), filepath.Join(dir, strings.TrimSuffix(name, ".so")+".c"))
	case GoChain, GoLeaf, GoSys:
		return BuildGo(tb, name, filepath.Join(dir, name))
	case GoCgo, GoCall:
		return BuildCgo(tb, name, filepath.Join(dir, name), noFramePointers)
	}
	tb.Fatalf("unknown workload %q", name)
	return ""
}

// CrossCC and CrossCXX are Debian's aarch64 cross compilers
// (gcc-aarch64-linux-gnu, g++-aarch64-linux-gnu) the arm64 tests build
// their C and C++ workloads with.
const (
	CrossCC  = "aarch64-linux-gnu-gcc"
	CrossCXX = "aarch64-linux-gnu-g++"
)

// BuildWorkloadARM64 builds the named workload for linux/arm64, static so
// that it runs in a guest with no libraries (the QEMU check): C and C++ with
// the cross compilers and the flags BuildWorkload uses, Go with GOARCH.
// CPAC is CChainNoFP with return addresses signed (-mbranch-protection).
func BuildWorkloadARM64(tb testing.TB, name string) string {
	tb.Helper()
	dir := workloadDir(tb)
	static := func(flags []string) []string { return append([]string{"-static"}, flags...) }
	switch name {
	case CChainNoFP:
		return BuildCWith(tb, CrossCC, name, static(noFramePointers), filepath.Join(dir, CChain+".c"))
	case CPAC:
		return BuildCWith(tb, CrossCC, name, static(append([]string{"-mbranch-protection=standard"}, noFramePointers...)), filepath.Join(dir, CChain+".c"))
	case CChain:
		return BuildCWith(tb, CrossCC, name, static([]string{"-O0", "-g", "-fno-omit-frame-pointer", "-fno-inline"}), filepath.Join(dir, name+".c"))
	case QSort, Recurse, Signal, VDSOLoop:
		return BuildCWith(tb, CrossCC, name, static(noFramePointers), filepath.Join(dir, name+".c"))
	case Throw:
		return BuildCWith(tb, CrossCXX, name, static(noFramePointers), filepath.Join(dir, name+".cc"))
	case GoChain, GoLeaf, GoSys, GoTime:
		return BuildGoFor(tb, name, filepath.Join(dir, name), "arm64")
	case GoCall, GoCgo:
		return BuildCgoFor(tb, CrossCC, name, filepath.Join(dir, name), "arm64", noFramePointers,
			"-ldflags=-linkmode=external -extldflags=-static")
	}
	tb.Fatalf("no arm64 build of workload %q", name)
	return ""
}

// CPAC names BuildWorkloadARM64's cchain.c without frame pointers and with
// pointer authentication (-mbranch-protection=standard).
const CPAC = "cpac"

// DebianRustc is Debian's rustc, whose standard library Debian also builds
// for arm64 (libstd-rust-dev:arm64, the same version): the Rust a cross
// build needs. A rustup toolchain earlier in PATH has no aarch64 library.
const DebianRustc = "/usr/bin/rustc"

// BuildRustARM64 builds workloads/rchain.rs for linux/arm64, static and
// without frame pointers, with DebianRustc and sysroot, the root of an
// aarch64 standard library of its version (lib/rustlib/aarch64-unknown-linux-gnu).
func BuildRustARM64(tb testing.TB, sysroot string) string {
	tb.Helper()
	RequireTool(tb, CrossCC)
	out := filepath.Join(tb.TempDir(), "rchain")
	run(tb, exec.Command(DebianRustc, "--edition", "2021", "--target", "aarch64-unknown-linux-gnu", "--sysroot", sysroot,
		"-C", "linker="+CrossCC, "-C", "target-feature=+crt-static", "-C", "opt-level=2", "-C", "force-frame-pointers=no",
		"-C", "debuginfo=0", "-o", out, filepath.Join(workloadDir(tb), "rchain.rs")))
	return out
}

// StartWorkload runs a binary until the test ends and returns its command.
// The workload is killed with the test, and also when the test binary dies
// without running its cleanups (killed, or its output pipe closed): a
// leftover CPU burner would skew every later measurement on the machine.
func StartWorkload(tb testing.TB, path string, args ...string) *exec.Cmd {
	tb.Helper()
	cmd := exec.Command(path, args...)
	StartCmd(tb, cmd)
	return cmd
}

// StartCmd starts a command the test prepared (its environment, namespaces,
// a wrapper such as CommandInCgroup) with the guarantees of StartWorkload:
// it is killed and reaped when the test ends or the test binary dies.
// Settings already in cmd.SysProcAttr are kept.
func StartCmd(tb testing.TB, cmd *exec.Cmd) {
	tb.Helper()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", cmd.Path, err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
}

// StartReady starts cmd as StartCmd does and waits, at most limit, for it
// to print a line "ready" on its standard output (what the runtime
// workloads print once their chain runs); the rest of that output is
// read and dropped.
func StartReady(tb testing.TB, cmd *exec.Cmd, limit time.Duration) {
	tb.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	StartCmd(tb, cmd)
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		said := false
		for sc.Scan() {
			if !said && sc.Text() == "ready" {
				said = true
				ready <- true
			}
		}
		if !said {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			tb.Fatalf("%s ended without saying ready", strings.Join(cmd.Args, " "))
		}
	case <-time.After(limit):
		tb.Fatalf("%s did not say ready within %v", strings.Join(cmd.Args, " "), limit)
	}
}

// WaitExec waits until process pid shows the command line args, so a test
// reads the new image only after execve finished setting it up: Go's Start
// returns once the child's descriptors close, which is before the kernel has
// set the new image's arguments and environment.
func WaitExec(tb testing.TB, pid int, args []string) {
	tb.Helper()
	want := strings.Join(args, "\x00") + "\x00"
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && string(b) == want {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("process %d: command line %q, want %q (err %v)", pid, b, want, err)
		}
		time.Sleep(time.Millisecond) // poll interval of the condition above
	}
}
