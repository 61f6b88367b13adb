package kernelcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/support"
	"github.com/sonde-dev/sonde/tracer"
)

// resultPrefix starts the one line of the serial console that carries the
// guest's report, as JSON.
const resultPrefix = "SONDE-KERNELCHECK-RESULT "

// childEnv makes the test binary exit at once: the guest runs itself as a
// child so that the exec and exit tracepoints fire.
const childEnv = "SONDE_KERNELCHECK_CHILD"

// guestEnv makes the test binary do the guest's work and print its report:
// init starts it once the filesystems are mounted, as a new process, since
// cilium/ebpf reads /proc/self/mountinfo once per process.
const guestEnv = "SONDE_KERNELCHECK_GUEST"

// report is what the guest prints on the console.
type report struct {
	Kernel   string          `json:"kernel"`
	CPUs     int             `json:"cpus"`
	FindVMA  bool            `json:"find_vma"` // the kernel has bpf_find_vma
	Programs []programResult `json:"programs"`
	Tracer   tracerResult    `json:"tracer"`
	Setup    string          `json:"setup,omitempty"` // what failed before any program was loaded
	// Sampling: the profiler's run over the workloads the initramfs
	// carries (the arm64 check's), by workload.
	Sampling map[string]samplingResult `json:"sampling,omitempty"`
	Profiler *profilerStats            `json:"profiler,omitempty"`
}

// programResult is the verdict of the kernel's verifier on one program.
type programResult struct {
	Name string `json:"name"`
	Type string `json:"type"`
	// Loaded: the verifier accepted it.
	Loaded bool `json:"loaded"`
	// Unsupported: the kernel lacks a helper this build needs, and the
	// tracer loads the other build in its place.
	Unsupported string `json:"unsupported,omitempty"`
	Error       string `json:"error,omitempty"`
	// VerifierLog: the verifier's output when it rejected the program.
	VerifierLog   []string `json:"verifier_log,omitempty"`
	VerifiedInsns uint32   `json:"verified_insns,omitempty"`
	// LoadMillis: how long loading took (mostly the verifier).
	LoadMillis int64 `json:"load_ms"`
}

// tracerResult is what a Tracer with off-CPU profiling on did in the guest.
type tracerResult struct {
	Error           string         `json:"error,omitempty"`
	CheckedMappings bool           `json:"checked_mappings"`
	OffCPU          bool           `json:"off_cpu"`
	Records         map[string]int `json:"records"`
	DecodeErrors    int            `json:"decode_errors"`
	// TableLoaded: an unwind table went into the kernel (LoadTable);
	// TableError says why not.
	TableLoaded bool           `json:"table_loaded"`
	TableError  string         `json:"table_error,omitempty"`
	Counters    map[string]int `json:"counters,omitempty"`
}

var recordNames = map[tracer.RecordType]string{
	tracer.RecordSample:      "sample",
	tracer.RecordExec:        "exec",
	tracer.RecordExit:        "exit",
	tracer.RecordUnknown:     "unknown",
	tracer.RecordOffCPUStart: "offcpu_start",
	tracer.RecordOffCPUEnd:   "offcpu_end",
}

// wantRecords are the record types a working Tracer produces in the guest:
// on-CPU samples, the exec and exit of a child, and both halves of off-CPU
// waits.
var wantRecords = []string{"sample", "exec", "exit", "offcpu_start", "offcpu_end"}

func TestMain(m *testing.M) {
	switch {
	case os.Getenv(childEnv) != "":
		os.Exit(0)
	case os.Getenv(guestEnv) != "":
		guestMain()
	case os.Getpid() == 1:
		initMain()
	}
	os.Exit(m.Run())
}

// initMain is init in the VM: it mounts what the loader reads, runs the
// guest, and powers the machine off. It never returns; if power-off fails,
// init exits and the kernel panics, which with panic=-1 and -no-reboot also
// ends QEMU.
func initMain() {
	if err := mountFilesystems(); err != nil {
		printReport(report{Setup: err.Error()})
	} else {
		cmd := exec.Command("/init")
		cmd.Env = []string{guestEnv + "=1"}
		cmd.Stdout = os.Stdout
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Printf("\nguest: %v\n", err)
		}
	}
	unix.Sync()
	err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	fmt.Printf("power off: %v\n", err)
	os.Exit(1)
}

// guestMain does the guest's work and prints its report.
func guestMain() {
	printReport(guest())
	os.Exit(0)
}

func printReport(r report) {
	b, err := json.Marshal(r)
	if err != nil {
		b = []byte(fmt.Sprintf(`{"setup":%q}`, "encode report: "+err.Error()))
	}
	// On a line of its own, so no kernel message shares it.
	fmt.Printf("\n%s%s\n", resultPrefix, b)
}

func guest() report {
	var r report
	var uts unix.Utsname
	if err := unix.Uname(&uts); err == nil {
		r.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	r.CPUs = runtime.NumCPU()
	r.FindVMA = features.HaveProgramHelper(ebpf.PerfEvent, asm.FnFindVma) == nil
	programs, err := loadEachProgram(r.FindVMA)
	if err != nil {
		r.Setup = err.Error()
		return r
	}
	r.Programs = programs
	r.Tracer = runTracer()
	if _, err := os.Stat(workloadDir); err == nil {
		r.Sampling, r.Profiler = runSampling()
	}
	return r
}

// mountFilesystems gives init what the guest needs: /dev (/dev/null for
// its children), /proc (capabilities, mounts), /sys (kernel BTF in
// /sys/kernel/btf, online CPUs).
func mountFilesystems() error {
	for _, m := range []struct{ fstype, dir string }{
		{"devtmpfs", "/dev"},
		{"proc", "/proc"},
		{"sysfs", "/sys"},
	} {
		if err := os.MkdirAll(m.dir, 0o755); err != nil {
			return fmt.Errorf("mount %s: %w", m.dir, err)
		}
		if err := unix.Mount(m.fstype, m.dir, m.fstype, 0, ""); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.dir, err)
		}
	}
	return nil
}

// loadEachProgram loads every program of the collection on its own, with the
// maps it uses, and records the verifier's verdict; as many at a time as
// there are CPUs, since each verification is single-threaded. The builds
// that use bpf_find_vma are only expected to load where the kernel has it.
func loadEachProgram(findVMA bool) ([]programResult, error) {
	spec, err := support.LoadSonde()
	if err != nil {
		return nil, fmt.Errorf("load collection spec: %w", err)
	}
	names := make([]string, 0, len(spec.Programs))
	for name := range spec.Programs {
		names = append(names, name)
	}
	slices.Sort(names)
	out := make([]programResult, len(names))
	sem := make(chan struct{}, max(runtime.NumCPU(), 1))
	var wg sync.WaitGroup
	for i, name := range names {
		needsFindVMA := name == support.SondeProgUnwindUser || name == support.SondeProgOffCpuUnwindUser
		one := spec.Copy()
		one.Programs = map[string]*ebpf.ProgramSpec{name: one.Programs[name]}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i] = loadProgram(one, name, needsFindVMA && !findVMA)
		})
	}
	wg.Wait()
	return out, nil
}

// loadProgram loads the one program of spec.
func loadProgram(spec *ebpf.CollectionSpec, name string, unsupported bool) programResult {
	res := programResult{Name: name, Type: spec.Programs[name].Type.String()}
	if unsupported {
		res.Unsupported = "kernel lacks bpf_find_vma; the tracer loads the unchecked build"
		return res
	}
	start := time.Now()
	coll, err := ebpf.NewCollection(spec)
	res.LoadMillis = time.Since(start).Milliseconds()
	if err != nil {
		res.Error = err.Error()
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			res.VerifierLog = ve.Log
		}
		return res
	}
	defer coll.Close()
	res.Loaded = true
	if info, err := coll.Programs[name].Info(); err == nil {
		res.VerifiedInsns, _ = info.VerifiedInstructions()
	}
	return res
}

// runTracer starts a Tracer with off-CPU profiling on every context switch
// and reads records until each wanted type has arrived or a deadline passes,
// while a goroutine burns CPU and sleeps and a child execs and exits.
func runTracer() tracerResult {
	res := tracerResult{Records: map[string]int{}}
	tr, err := tracer.New(tracer.Options{
		SamplesPerSecond: 199,
		OffCPUThreshold:  1,
		PollInterval:     20 * time.Millisecond,
	})
	if err != nil {
		res.Error = err.Error()
		return res
	}
	res.CheckedMappings = tr.CheckedMappings()
	res.OffCPU = tr.OffCPU()
	if row, ok := tracer.MakeRow(0, tracer.CFASP, 8, tracer.FPSame, 0); !ok {
		res.TableError = "no row"
	} else if err := tr.LoadTable(1, []tracer.Row{row}, nil); err != nil {
		res.TableError = err.Error()
	} else {
		res.TableLoaded = true
		if err := tr.UnloadTable(1); err != nil {
			res.TableError = "unload: " + err.Error()
		}
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		// Runs on the CPU (samples) and blocks (off-CPU waits).
		x := 0
		for {
			select {
			case <-stop:
				return
			default:
			}
			for i := range 1 << 20 {
				x += i
			}
			time.Sleep(time.Millisecond)
		}
	})
	wg.Go(func() {
		// Execs and exits, again until stopped: one child is enough, but
		// the first may run before the reader drains the ring buffer.
		for {
			cmd := exec.Command("/init")
			cmd.Env = []string{childEnv + "=1"}
			_ = cmd.Run()
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})

	seen := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var rec tracer.Record
		closed := false
		for {
			err := tr.ReadInto(&rec)
			if errors.Is(err, tracer.ErrClosed) {
				return
			}
			if err != nil {
				res.DecodeErrors++
				continue
			}
			name, ok := recordNames[rec.Type]
			if !ok {
				name = fmt.Sprintf("type_%d", rec.Type)
			}
			res.Records[name]++
			if !closed && hasAll(res.Records) {
				closed = true
				close(seen)
			}
		}
	}()
	select {
	case <-seen:
	case <-time.After(30 * time.Second):
	}
	close(stop)
	wg.Wait()
	c, cerr := tr.Counters()
	if err := tr.Close(); err != nil && res.Error == "" {
		res.Error = "close: " + err.Error()
	}
	<-done
	if cerr != nil {
		if res.Error == "" {
			res.Error = "counters: " + cerr.Error()
		}
	} else {
		res.Counters = map[string]int{
			"samples":        int(c.Samples),
			"samples_sent":   int(c.SamplesSent),
			"lost":           int(c.Lost()),
			"offcpu_starts":  int(c.OffCPUStartsSent),
			"task_events":    int(c.TaskEventsSent),
			"tail_call_errs": int(c.TailCallErrors),
		}
	}
	return res
}

func hasAll(records map[string]int) bool {
	for _, w := range wantRecords {
		if records[w] == 0 {
			return false
		}
	}
	return true
}
