package process

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
	"golang.org/x/sys/unix"
)

// sleeper is a running instance of testdata/sleeper.c.
type sleeper struct {
	cmd          *exec.Cmd
	pid          int
	main, getpid uint64 // run-time addresses
	workerTID    int
}

// buildSleeper compiles the fixture once per test.
func buildSleeper(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/proc/self/maps"); err != nil {
		t.Skipf("no procfs: %v", err)
	}
	return testutil.BuildC(t, "sleeper", []string{"-O1", "-g", "-pthread"}, "testdata/sleeper.c")
}

// startSleeper runs bin as a child of the test with extra environment
// variables and waits for it to report its addresses.
func startSleeper(t *testing.T, bin, threadName string, env ...string) *sleeper {
	t.Helper()
	cmd := exec.Command(bin, threadName)
	cmd.Env = append(os.Environ(), env...)
	return startSleeperCmd(t, cmd)
}

// startSleeperCmd starts a sleeper command the test prepared.
func startSleeperCmd(t *testing.T, cmd *exec.Cmd) *sleeper {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sleeper: %v", err)
	}
	s := &sleeper{cmd: cmd, pid: cmd.Process.Pid}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait() // killed: an error by construction
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("read from sleeper: %v", err)
	}
	if _, err := fmt.Sscanf(line, "main=0x%x getpid=0x%x tid=%d", &s.main, &s.getpid, &s.workerTID); err != nil {
		t.Fatalf("parse %q: %v", line, err)
	}
	return s
}

// elfFileOffset returns the file offset of symbol name in the ELF file at
// path, from its symbol tables and program headers: an oracle independent
// of /proc.
func elfFileOffset(t *testing.T, path, name string) uint64 {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, _ := f.Symbols()
	dyn, _ := f.DynamicSymbols()
	for _, s := range append(syms, dyn...) {
		if s.Name != name || elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Value == 0 {
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_LOAD && s.Value >= p.Vaddr && s.Value < p.Vaddr+p.Filesz {
				return s.Value - p.Vaddr + p.Off
			}
		}
	}
	t.Fatalf("%s: no function %s in a loaded segment", path, name)
	return 0
}

func statOf(t *testing.T, path string) (dev, ino uint64) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Dev, st.Ino
}

// canOpenMapFiles reports whether this process may open map_files entries
// (CAP_SYS_ADMIN, or CAP_CHECKPOINT_RESTORE on kernels >= 5.9).
func canOpenMapFiles() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) != nil {
		return false
	}
	has := func(c uint) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
	return has(unix.CAP_SYS_ADMIN) || has(unix.CAP_CHECKPOINT_RESTORE)
}

// TestRealProcess reads a child process from the real procfs. Children are
// ours, so this needs no privileges.
func TestRealProcess(t *testing.T) {
	bin := buildSleeper(t)
	s := startSleeper(t, bin, "sonde-worker", "OTEL_SERVICE_NAME=sleeper-svc", "SONDE_TEST_VAR=42")
	tab := NewTable("", nil, Options{EnvVars: []string{"SONDE_TEST_VAR"}})

	p, err := tab.Get(s.pid)
	if err != nil {
		t.Fatalf("Get(%d) = %v", s.pid, err)
	}
	wantExe, err := filepath.EvalSymlinks(bin)
	if err != nil {
		t.Fatal(err)
	}
	if p.PID != s.pid || p.PPID != os.Getpid() || p.ExePath != wantExe || p.ExeDeleted ||
		p.Name != "sleeper" || p.Comm != "sleeper" || p.KernelThread {
		t.Errorf("Get() = %+v; want pid %d, ppid %d, exe %s, name and comm sleeper", p, s.pid, os.Getpid(), wantExe)
	}
	if p.ServiceName != "sleeper-svc" || p.Env["SONDE_TEST_VAR"] != "42" || len(p.Env) != 1 {
		t.Errorf("ServiceName = %q, Env = %v; want sleeper-svc and SONDE_TEST_VAR=42 only", p.ServiceName, p.Env)
	}

	self, err := tab.Get(os.Getpid())
	if err != nil {
		t.Fatalf("Get(self) = %v", err)
	}
	if p.StartTime < self.StartTime {
		t.Errorf("child StartTime %d before the test's %d", p.StartTime, self.StartTime)
	}
	// A child inherits the cgroup of its parent.
	if p.CgroupPath != self.CgroupPath || p.ContainerID != self.ContainerID || p.CgroupPath == "" {
		t.Errorf("child cgroup %q container %q, parent %q %q; want equal and non-empty",
			p.CgroupPath, p.ContainerID, self.CgroupPath, self.ContainerID)
	}
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", s.pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cg), ":"+p.CgroupPath+"\n") {
		t.Errorf("CgroupPath %q is not a path of /proc/PID/cgroup:\n%s", p.CgroupPath, cg)
	}

	tests := []struct {
		name     string
		addr     uint64
		inFile   func(path string) bool
		symbol   string
		wantPath string
	}{
		{"main in the executable", s.main, func(path string) bool { return path == wantExe }, "main", wantExe},
		{"getpid in libc", s.getpid, func(path string) bool { return strings.HasPrefix(filepath.Base(path), "libc") }, "getpid", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := p.FindMapping(tt.addr)
			if !ok {
				t.Fatalf("FindMapping(%#x) found nothing in %+v", tt.addr, p.Mappings)
			}
			if !tt.inFile(m.Path) || !m.Executable() || m.Deleted {
				t.Fatalf("FindMapping(%#x) = %+v, want an executable mapping of the right file", tt.addr, m)
			}
			if got, want := m.FileOffset(tt.addr), elfFileOffset(t, m.Path, tt.symbol); got != want {
				t.Errorf("file offset of %s = %#x, ELF says %#x", tt.symbol, got, want)
			}
			dev, ino := statOf(t, m.Path)
			if m.Dev != dev || m.Inode != ino {
				t.Errorf("mapping dev %#x inode %d, stat says %#x %d", m.Dev, m.Inode, dev, ino)
			}
			fp := p.FilePath(m)
			if canOpenMapFiles() != strings.Contains(fp, "/map_files/") {
				t.Errorf("FilePath() = %q; map_files usable: %v", fp, canOpenMapFiles())
			}
			if dev, ino := statOf(t, fp); m.Dev != dev || m.Inode != ino {
				t.Errorf("FilePath() %s is dev %#x inode %d, want the mapped %#x %d", fp, dev, ino, m.Dev, m.Inode)
			}
		})
	}

	if got, err := ThreadName("/proc", s.pid, s.workerTID); err != nil || got != "sonde-worker" {
		t.Errorf("ThreadName(worker) = %q, %v; want sonde-worker", got, err)
	}
	if got, err := ThreadName("/proc", s.pid, s.pid); err != nil || got != "sleeper" {
		t.Errorf("ThreadName(leader) = %q, %v; want sleeper", got, err)
	}

	// Killed but not reaped: a zombie, gone for the profiler.
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, s.pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatalf("waitid: %v", err)
	}
	if _, err := NewTable("", nil, Options{}).Get(s.pid); !errors.Is(err, ErrGone) {
		t.Errorf("Get(zombie) = %v, want ErrGone", err)
	}
	tab.Exec(s.pid)
	if _, err := tab.Get(s.pid); !errors.Is(err, ErrGone) {
		t.Errorf("Get(zombie) after Exec = %v, want ErrGone", err)
	}
	_ = s.cmd.Wait() // reaps the zombie; killed, so an error by construction
	if _, err := tab.Get(s.pid); !errors.Is(err, ErrGone) {
		t.Errorf("Get(reaped) = %v, want ErrGone", err)
	}
	if _, err := ThreadName("/proc", s.pid, s.workerTID); !errors.Is(err, ErrGone) {
		t.Errorf("ThreadName(reaped) = %v, want ErrGone", err)
	}
	if st := tab.Stats(); st.Gone != 2 || st.Errors != 0 {
		t.Errorf("Stats() = %+v, want 2 gone and no errors", st)
	}
}

// TestRealDeletedExecutable runs a binary that is deleted while it runs, the
// case of upgraded packages and JIT files.
func TestRealDeletedExecutable(t *testing.T) {
	built := buildSleeper(t)
	bin := filepath.Join(t.TempDir(), "doomed")
	copyFile(t, built, bin)
	bin, err := filepath.EvalSymlinks(bin)
	if err != nil {
		t.Fatal(err)
	}
	dev, ino := statOf(t, bin)
	s := startSleeper(t, bin, "w")
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}

	p, err := NewTable("", nil, Options{}).Get(s.pid)
	if err != nil {
		t.Fatalf("Get() = %v", err)
	}
	if p.ExePath != bin || !p.ExeDeleted || p.Name != "doomed" {
		t.Errorf("ExePath %q ExeDeleted %v Name %q; want %s, true, doomed", p.ExePath, p.ExeDeleted, p.Name, bin)
	}
	m, ok := p.FindMapping(s.main)
	if !ok || m.Path != bin || !m.Deleted || m.Dev != dev || m.Inode != ino {
		t.Fatalf("FindMapping(main) = %+v, %v; want the deleted %s (dev %#x inode %d)", m, ok, bin, dev, ino)
	}
	fp := p.FilePath(m)
	if !canOpenMapFiles() {
		if fp != "" {
			t.Errorf("FilePath(deleted) without map_files access = %q, want \"\"", fp)
		}
		return
	}
	f, err := os.Open(fp)
	if err != nil {
		t.Fatalf("open FilePath(deleted) %q: %v", fp, err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Dev != dev || st.Ino != ino {
		t.Errorf("FilePath(deleted) opens dev %#x inode %d, want %#x %d", st.Dev, st.Ino, dev, ino)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRealScan scans the real procfs: every process we may read is cached
// (all of them as root), kernel threads are not.
func TestRealScan(t *testing.T) {
	bin := buildSleeper(t)
	s := startSleeper(t, bin, "w")
	tab := NewTable("", nil, Options{})
	if err := tab.Scan(); err != nil {
		t.Fatalf("Scan() = %v", err)
	}
	st := tab.Stats()
	for _, pid := range []int{os.Getpid(), s.pid} {
		p, err := tab.Get(pid)
		if err != nil || p.KernelThread || len(p.Mappings) == 0 {
			t.Errorf("Get(%d) after Scan = %+v, %v; want a user process with mappings", pid, p, err)
		}
	}
	if got := tab.Stats().Loads; got != st.Loads {
		t.Errorf("Get of scanned pids loaded %d more, want 0", got-st.Loads)
	}
	if tab.Len() < 2 {
		t.Errorf("Len() = %d after Scan, want at least 2", tab.Len())
	}
	// Failures are only for processes whose maps this user may not open
	// (or that exited since).
	tab.mu.RLock()
	var failed []int
	for pid := range tab.failed {
		failed = append(failed, pid)
	}
	tab.mu.RUnlock()
	if uint64(len(failed)) != st.Errors {
		t.Errorf("Scan: %d pids remembered as failed, Stats().Errors = %d", len(failed), st.Errors)
	}
	for _, pid := range failed {
		f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
		if err == nil {
			f.Close()
			t.Errorf("Scan failed to read pid %d, whose maps open(2) allows", pid)
		} else if !errors.Is(err, os.ErrPermission) && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pid %d: %v", pid, err)
		}
	}
	// Kernel threads, where this pid namespace shows them, are skipped.
	if b, err := os.ReadFile("/proc/2/stat"); err == nil {
		if ps, err := parseStat(b); err == nil && ps.kernelThread() {
			if st.Skipped == 0 {
				t.Errorf("Stats().Skipped = 0 though pid 2 is a kernel thread")
			}
			tab.mu.RLock()
			_, cached := tab.entries[2]
			tab.mu.RUnlock()
			if cached {
				t.Errorf("Scan cached kernel thread 2")
			}
		}
	}
}

// A real process is alive until it exits: as a zombie, and once reaped, it
// is gone.
func TestRealAlive(t *testing.T) {
	bin := buildSleeper(t)
	s := startSleeper(t, bin, "sonde-worker")
	p, err := NewTable("", nil, Options{}).Get(s.pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Alive(); err != nil {
		t.Fatalf("running: Alive() = %v", err)
	}
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Not reaped yet: a zombie once the kernel is done with it.
	var si unix.Siginfo
	if err := unix.Waitid(unix.P_PID, s.pid, &si, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.Alive(); !errors.Is(err, ErrGone) {
		t.Errorf("zombie: Alive() = %v, want ErrGone", err)
	}
	_ = s.cmd.Wait() // reaps the zombie; killed, so an error by construction
	if err := p.Alive(); !errors.Is(err, ErrGone) {
		t.Errorf("reaped: Alive() = %v, want ErrGone", err)
	}
}
