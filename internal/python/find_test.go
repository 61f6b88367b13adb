package python

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// workloadPath is the absolute path of testdata/workload.py.
func workloadPath(t testing.TB) string {
	t.Helper()
	p, err := filepath.Abs("testdata/workload.py")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// markLine returns the line of the workload that carries "# MARK name".
func markLine(t testing.TB, name string) int64 {
	t.Helper()
	b, err := os.ReadFile("testdata/workload.py")
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.HasSuffix(l, "# MARK "+name) {
			return int64(i + 1)
		}
	}
	t.Fatalf("no MARK %s in the workload", name)
	return 0
}

// startWorkload runs the workload in mode under bin and waits until it
// says it is ready. The process dies with the test.
func startWorkload(t testing.TB, bin, mode string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, workloadPath(t), mode)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close() // a pipe: the workload is killed next anyway
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("workload %s %s: %q, %v", bin, mode, line, err)
	}
	return cmd
}

// waitInRead waits until pid's main thread blocks in read(2): the
// workload printed "ready" just before, so until then its leaf line moves.
func waitInRead(t testing.TB, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/syscall")
		if err == nil && strings.HasPrefix(string(b), "0 ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("workload %d never blocked in read: %q, %v", pid, b, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func findInterp(t testing.TB, pid int) (*Interp, *ProcMem) {
	t.Helper()
	procs := process.NewTable("/proc", zap.NewNop(), process.Options{})
	p, err := procs.Get(pid)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := OpenMem("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testutil.Close(t, mem) })
	in, err := Find(p, mem)
	if err != nil {
		t.Fatalf("find interpreter of %d: %v", pid, err)
	}
	return in, mem
}

type namedFrame struct {
	Name string
	File string
	Line int64
}

// TestWalkEveryInterpreter finds each interpreter in a live process, walks
// its main thread from user space and names the frames: the chain, files
// and lines of the workload must come out exactly.
func TestWalkEveryInterpreter(t *testing.T) {
	wl := workloadPath(t)
	for _, in := range installedInterpreters(t) {
		t.Run(in.version, func(t *testing.T) {
			t.Parallel()
			cmd := startWorkload(t, in.bin, "wait")
			waitInRead(t, cmd.Process.Pid)
			interp, mem := findInterp(t, cmd.Process.Pid)
			if interp.Minor != in.minor {
				t.Fatalf("found 3.%d, want 3.%d", interp.Minor, in.minor)
			}
			threads, err := interp.Threads(mem)
			if err != nil {
				t.Fatalf("walk: %v", err)
			}
			if len(threads) != 1 {
				t.Fatalf("%d threads, want 1", len(threads))
			}
			r := NewReader(mem, interp.Layout)
			var got []namedFrame
			for _, f := range threads[0].Frames {
				c, err := r.Code(f.Code)
				if err != nil {
					t.Fatalf("code of frame %+v: %v", f, err)
				}
				got = append(got, namedFrame{c.Name, c.File, c.Line(f.Instr)})
			}
			method := "method"
			if in.minor >= 11 {
				method = "Beta.method"
			}
			want := []namedFrame{
				{"gamma_wait", wl, markLine(t, "wait")},
				{method, wl, markLine(t, "call-leaf")},
				{"alpha", wl, markLine(t, "call-method")},
				{"<module>", wl, markLine(t, "call-alpha")},
			}
			if len(got) != len(want) {
				t.Fatalf("frames %+v, want %+v", got, want)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("frame %d: %+v, want %+v", i, got[i], want[i])
				}
			}
			// One eval run on 3.11+ (calls between Python functions are
			// inlined), one per frame before.
			for i, f := range threads[0].Frames {
				wantEntry := in.minor < 11 || i == len(threads[0].Frames)-1
				if f.Entry != wantEntry {
					t.Errorf("frame %d entry %v, want %v", i, f.Entry, wantEntry)
				}
			}
		})
	}
}

func TestFindNotPython(t *testing.T) {
	procs := process.NewTable("/proc", zap.NewNop(), process.Options{})
	p, err := procs.Get(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Find(p, nil); !errors.Is(err, ErrNotPython) {
		t.Fatalf("Find(test binary) = %v, want ErrNotPython", err)
	}
}
