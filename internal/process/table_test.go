package process

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// fakeClock is a manual clock for the refresh rate limit.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

var (
	textInit = Mapping{Start: 0x55550000, End: 0x55560000, Offset: 0x1000, Perms: "r-xp", Dev: unix.Mkdev(8, 1), Inode: 11, Path: "/sbin/init"}
	dataInit = Mapping{Start: 0x55560000, End: 0x55561000, Offset: 0x11000, Perms: "rw-p", Dev: unix.Mkdev(8, 1), Inode: 11, Path: "/sbin/init"}
	textLibc = Mapping{Start: 0x7f0000026000, End: 0x7f000017c000, Offset: 0x26000, Perms: "r-xp", Dev: unix.Mkdev(8, 1), Inode: 12, Path: "/usr/lib/libc.so.6"}
	heap     = Mapping{Start: 0x55570000, End: 0x55590000, Perms: "rw-p", Path: "[heap]"}
	vdso     = Mapping{Start: 0x7ffd00000000, End: 0x7ffd00002000, Perms: "r-xp", Path: "[vdso]"}
	textApp  = Mapping{Start: 0x400000, End: 0x500000, Perms: "r-xp", Dev: unix.Mkdev(0, 0x2f), Inode: 77, Path: "/app/server", Deleted: true}
	textNew  = Mapping{Start: 0x600000, End: 0x700000, Perms: "r-xp", Dev: unix.Mkdev(8, 1), Inode: 13, Path: "/usr/bin/python3"}
)

// standardProcs is a small host: init, a container process, a kernel thread.
func standardProcs() []fakeProc {
	return []fakeProc{
		{
			pid: 1, comm: "systemd", start: 10, exe: "/sbin/init",
			// Out of order on purpose: the table sorts.
			maps:    mapsText(textLibc, textInit, dataInit, heap, vdso),
			cgroup:  "0::/init.scope\n",
			cmdline: "/sbin/init\x00splash\x00",
		},
		{
			pid: 100, ppid: 1, comm: "server (v2)", start: 500, exe: "/app/server (deleted)",
			maps:    mapsText(textApp, heap, textLibc),
			cgroup:  "0::/system.slice/docker-" + id1 + ".scope\n",
			environ: "PATH=/bin\x00OTEL_SERVICE_NAME=checkout\x00DEPLOY=blue\x00",
			cmdline: "/app/server\x00--port\x008080\x00",
			nspid:   []int{1},
			threads: map[int]string{101: "worker 1"},
		},
		{pid: 2, comm: "kthreadd", start: 2, flags: pfKthread},
	}
}

func newTestTable(t *testing.T, fs *fakeProcfs, opts Options) (*Table, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	if opts.Now == nil {
		opts.Now = clock.Now
	}
	return NewTable(fs.root, nil, opts), clock
}

var cmpProcess = cmp.AllowUnexported(Process{})

func TestTableScan(t *testing.T) {
	fs := newFakeProcfs(t)
	for _, p := range standardProcs() {
		fs.add(p)
	}
	// A process that exits during the scan: its maps are already gone.
	fs.add(fakeProc{pid: 300, comm: "short", start: 900, exe: "/bin/true", maps: mapsText(textInit)})
	fs.remove(300, "maps")

	tab, _ := newTestTable(t, fs, Options{EnvVars: []string{"DEPLOY", "MISSING"}, CommandLine: true})
	if err := tab.Scan(); err != nil {
		t.Fatalf("Scan() = %v", err)
	}
	if got := tab.Len(); got != 2 {
		t.Errorf("Len() = %d after Scan, want 2 (init and the container process)", got)
	}
	wantStats := Stats{Loads: 4, Gone: 1, Skipped: 1}
	if diff := cmp.Diff(wantStats, tab.Stats()); diff != "" {
		t.Errorf("Stats() mismatch (-want +got):\n%s", diff)
	}

	tests := []struct {
		pid  int
		want *Process
	}{
		{1, &Process{
			PID: 1, StartTime: 10, ExePath: "/sbin/init", Name: "init", Comm: "systemd",
			CgroupPath: "/init.scope", CommandLine: "/sbin/init splash",
			Mappings: []Mapping{textInit, textLibc, vdso}, procfs: fs.root,
		}},
		{100, &Process{
			PID: 100, PPID: 1, StartTime: 500, ExePath: "/app/server", ExeDeleted: true, Name: "server",
			Comm: "server (v2)", CgroupPath: "/system.slice/docker-" + id1 + ".scope", ContainerID: id1,
			ServiceName: "checkout", Env: map[string]string{"DEPLOY": "blue"},
			CommandLine: "/app/server --port 8080", NamespacePID: 1,
			Mappings: []Mapping{textApp, textLibc}, procfs: fs.root,
		}},
	}
	for _, tt := range tests {
		got, err := tab.Get(tt.pid)
		if err != nil {
			t.Fatalf("Get(%d) = %v", tt.pid, err)
		}
		if diff := cmp.Diff(tt.want, got, cmpProcess); diff != "" {
			t.Errorf("Get(%d) mismatch (-want +got):\n%s", tt.pid, diff)
		}
	}
	if got := tab.Stats().Loads; got != 4 {
		t.Errorf("Stats().Loads = %d after Get of scanned pids, want 4 (no reload)", got)
	}

	// The kernel thread was not cached by Scan; Get loads and caches it.
	kt, err := tab.Get(2)
	if err != nil {
		t.Fatalf("Get(kthreadd) = %v", err)
	}
	want := &Process{PID: 2, StartTime: 2, Name: "kthreadd", Comm: "kthreadd", KernelThread: true, procfs: fs.root}
	if diff := cmp.Diff(want, kt, cmpProcess); diff != "" {
		t.Errorf("Get(kthreadd) mismatch (-want +got):\n%s", diff)
	}
	if got := tab.Len(); got != 3 {
		t.Errorf("Len() = %d after Get(kthreadd), want 3", got)
	}

	// A second scan prunes what exited without an Exit event and keeps the rest.
	if err := os.RemoveAll(fs.dir(100)); err != nil {
		t.Fatal(err)
	}
	loads := tab.Stats().Loads
	if err := tab.Scan(); err != nil {
		t.Fatalf("second Scan() = %v", err)
	}
	if got := tab.Len(); got != 2 {
		t.Errorf("Len() = %d after second Scan, want 2 (pid 100 pruned)", got)
	}
	// Only pid 300 (still unreadable) is read again; cached pids are checked
	// by their stat alone.
	if got := tab.Stats().Loads - loads; got != 1 {
		t.Errorf("second Scan loaded %d processes, want 1", got)
	}
}

func TestScanErrors(t *testing.T) {
	tab := NewTable(filepath.Join(t.TempDir(), "missing"), nil, Options{})
	if err := tab.Scan(); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Scan() of a missing procfs = %v, want ErrNotExist", err)
	}
}

func TestTableGetCachesWithoutRereading(t *testing.T) {
	fs := newFakeProcfs(t)
	fs.add(standardProcs()[0])
	tab, _ := newTestTable(t, fs, Options{})
	first, err := tab.Get(1)
	if err != nil {
		t.Fatalf("Get(1) = %v", err)
	}
	// Get is on the per-sample path: it must not look at procfs again, so
	// even a vanished process is answered from the cache.
	if err := os.RemoveAll(fs.dir(1)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		got, err := tab.Get(1)
		if err != nil || got != first {
			t.Fatalf("Get(1) = %p, %v; want the cached %p", got, err, first)
		}
	}
	if got := tab.Stats().Loads; got != 1 {
		t.Errorf("Stats().Loads = %d, want 1", got)
	}
}

func TestTableExec(t *testing.T) {
	fs := newFakeProcfs(t)
	p := standardProcs()[0]
	fs.add(p)
	tab, _ := newTestTable(t, fs, Options{})
	before, err := tab.Get(1)
	if err != nil {
		t.Fatalf("Get(1) = %v", err)
	}

	// exec keeps pid and start time and replaces the image.
	p.exe, p.comm, p.maps = "/usr/bin/python3", "python3", mapsText(textNew, heap)
	fs.add(p)
	if got, _ := tab.Get(1); got != before {
		t.Fatalf("Get(1) before Exec returned a new snapshot; want the cached one")
	}
	tab.Exec(1)
	after, err := tab.Get(1)
	if err != nil {
		t.Fatalf("Get(1) after Exec = %v", err)
	}
	if after.ExePath != "/usr/bin/python3" || after.Name != "python3" {
		t.Errorf("after Exec: ExePath %q Name %q, want /usr/bin/python3, python3", after.ExePath, after.Name)
	}
	if diff := cmp.Diff([]Mapping{textNew}, after.Mappings); diff != "" {
		t.Errorf("after Exec: Mappings mismatch (-want +got):\n%s", diff)
	}
	if before.ExePath != "/sbin/init" || len(before.Mappings) != 3 {
		t.Errorf("the old snapshot changed: %+v", before)
	}
	if s := tab.Stats(); s.Loads != 2 || s.Reused != 0 {
		t.Errorf("Stats() = %+v, want 2 loads and no reuse", s)
	}
}

func TestTableRefreshRateLimit(t *testing.T) {
	fs := newFakeProcfs(t)
	p := standardProcs()[1]
	fs.add(p)
	tab, clock := newTestTable(t, fs, Options{RefreshInterval: 100 * time.Millisecond, EnvVars: []string{"DEPLOY"}})
	orig, err := tab.Get(100)
	if err != nil {
		t.Fatalf("Get(100) = %v", err)
	}

	// The process dlopens a library.
	p.maps = mapsText(textApp, textNew, heap, textLibc)
	fs.add(p)

	clock.Advance(99 * time.Millisecond)
	for range 50 {
		got, err := tab.Refresh(100)
		if err != nil || got != orig {
			t.Fatalf("Refresh within the interval = %p, %v; want the cached %p", got, err, orig)
		}
	}
	if s := tab.Stats(); s.RefreshLimited != 50 || s.Refreshes != 0 {
		t.Errorf("Stats() = %+v, want 50 rate-limited refreshes and none done", s)
	}

	clock.Advance(time.Millisecond)
	got, err := tab.Refresh(100)
	if err != nil {
		t.Fatalf("Refresh after the interval = %v", err)
	}
	want := *orig
	want.Mappings = []Mapping{textApp, textNew, textLibc}
	if diff := cmp.Diff(&want, got, cmpProcess); diff != "" {
		t.Errorf("Refresh mismatch (-want +got):\n%s", diff)
	}
	if cached, _ := tab.Get(100); cached != got {
		t.Errorf("Get after Refresh did not return the refreshed snapshot")
	}
	if s := tab.Stats(); s.Refreshes != 1 || s.Loads != 1 {
		t.Errorf("Stats() = %+v, want 1 refresh and 1 load", s)
	}

	// The interval restarts from the refresh.
	if again, _ := tab.Refresh(100); again != got {
		t.Errorf("second Refresh right after one was not rate-limited")
	}
	// Refresh of an unknown pid is a load, not rate-limited.
	fs.add(standardProcs()[0])
	if _, err := tab.Refresh(1); err != nil {
		t.Errorf("Refresh(unknown pid) = %v", err)
	}
	if s := tab.Stats(); s.Loads != 2 {
		t.Errorf("Stats().Loads = %d after Refresh of an unknown pid, want 2", s.Loads)
	}
}

// A process read while its dynamic loader had not mapped libc yet, twice
// (at its exec, then by the preparer for a sample taken before it was
// prepared): a sample captured after the last read, in libc, refreshes it at
// once, past the rate limit; a sample captured before that read does not.
// Each image has maxForcedReads such reads.
func TestTableRefreshSinceFirstRead(t *testing.T) {
	fs := newFakeProcfs(t)
	p := standardProcs()[1]
	p.maps = mapsText(textApp, heap) // ld.so still mapping the libraries
	fs.add(p)
	tab, clock := newTestTable(t, fs, Options{RefreshInterval: 100 * time.Millisecond})
	if _, err := tab.Get(100); err != nil {
		t.Fatalf("Get(100) = %v", err)
	}
	clock.Advance(time.Millisecond)
	reread := clock.Now()
	orig, err := tab.Reread(100) // the preparer's, libc still unmapped
	if err != nil {
		t.Fatalf("Reread(100) = %v", err)
	}
	p.maps = mapsText(textApp, heap, textLibc)
	fs.add(p)
	clock.Advance(5 * time.Millisecond)

	if got, _ := tab.RefreshSince(100, reread.Add(-time.Millisecond)); got != orig {
		t.Errorf("RefreshSince a capture before the read = %p, want the cached %p", got, orig)
	}
	got, err := tab.RefreshSince(100, reread.Add(2*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	want := *orig
	want.Mappings = []Mapping{textApp, textLibc}
	if diff := cmp.Diff(&want, got, cmpProcess); diff != "" {
		t.Errorf("RefreshSince a capture after the read, within the rate limit (-want +got):\n%s", diff)
	}
	// A capture before that refresh began is answered by it.
	clock.Advance(time.Millisecond)
	if again, _ := tab.RefreshSince(100, reread.Add(3*time.Millisecond)); again != got {
		t.Errorf("RefreshSince a capture before the last read was not rate-limited")
	}
	if s := tab.Stats(); s.Refreshes != 2 || s.RefreshLimited != 2 {
		t.Errorf("Stats() = %+v, want 2 refreshes (the preparer's and one forced) and 2 rate-limited", s)
	}
	// Captures after each read force maxForcedReads reads in all, then the
	// rate limit holds.
	for range maxForcedReads - 1 {
		clock.Advance(time.Millisecond)
		if _, err := tab.RefreshSince(100, clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(time.Millisecond)
	last, _ := tab.Get(100)
	if again, _ := tab.RefreshSince(100, clock.Now()); again != last {
		t.Errorf("RefreshSince past maxForcedReads was not rate-limited")
	}
	if s := tab.Stats(); s.Refreshes != 1+maxForcedReads || s.RefreshLimited != 3 {
		t.Errorf("Stats() = %+v, want %d refreshes and 3 rate-limited", s, 1+maxForcedReads)
	}
	// A new image has its own.
	tab.Exec(100)
	if _, err := tab.Get(100); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Millisecond)
	if _, err := tab.RefreshSince(100, clock.Now()); err != nil {
		t.Fatal(err)
	}
	if s := tab.Stats(); s.Refreshes != 2+maxForcedReads {
		t.Errorf("Stats().Refreshes = %d after the new image's first RefreshSince, want %d", s.Refreshes, 2+maxForcedReads)
	}
}

func TestTablePIDReuse(t *testing.T) {
	old := standardProcs()[1]
	reused := fakeProc{pid: 100, ppid: 1, comm: "python3", start: 7000, exe: "/usr/bin/python3", maps: mapsText(textNew)}

	tests := []struct {
		name   string
		detect func(*Table, *fakeClock) (*Process, error)
	}{
		{"Refresh", func(tab *Table, c *fakeClock) (*Process, error) {
			c.Advance(time.Second)
			return tab.Refresh(100)
		}},
		{"Exec", func(tab *Table, _ *fakeClock) (*Process, error) {
			tab.Exec(100)
			return tab.Get(100)
		}},
		{"Scan", func(tab *Table, _ *fakeClock) (*Process, error) {
			if err := tab.Scan(); err != nil {
				return nil, err
			}
			return tab.Get(100)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newFakeProcfs(t)
			fs.add(old)
			tab, clock := newTestTable(t, fs, Options{})
			if _, err := tab.Get(100); err != nil {
				t.Fatalf("Get(100) = %v", err)
			}
			fs.add(reused)
			got, err := tt.detect(tab, clock)
			if err != nil {
				t.Fatalf("after reuse: %v", err)
			}
			want := &Process{PID: 100, PPID: 1, StartTime: 7000, ExePath: "/usr/bin/python3", Name: "python3",
				Comm: "python3", Mappings: []Mapping{textNew}, procfs: fs.root}
			if diff := cmp.Diff(want, got, cmpProcess); diff != "" {
				t.Errorf("after reuse mismatch (-want +got):\n%s", diff)
			}
			if s := tab.Stats(); s.Reused != 1 {
				t.Errorf("Stats().Reused = %d, want 1", s.Reused)
			}
		})
	}
}

func TestTableGone(t *testing.T) {
	base := fakeProc{pid: 100, comm: "app", start: 500, exe: "/bin/app", maps: mapsText(textInit)}
	tests := []struct {
		name        string
		refreshSees bool
		setup       func(fs *fakeProcfs)
	}{
		{"no directory", true, func(fs *fakeProcfs) { fs.remove(100, "") }},
		{"stat missing", true, func(fs *fakeProcfs) { fs.remove(100, "stat") }},
		{"stat empty", true, func(fs *fakeProcfs) { fs.write(100, "stat", "") }},
		{"exe link missing", false, func(fs *fakeProcfs) { fs.remove(100, "exe") }},
		{"maps missing", true, func(fs *fakeProcfs) { fs.remove(100, "maps") }},
		{"cgroup missing", false, func(fs *fakeProcfs) { fs.remove(100, "cgroup") }},
		{"environ missing", false, func(fs *fakeProcfs) { fs.remove(100, "environ") }},
		{"cmdline missing", false, func(fs *fakeProcfs) { fs.remove(100, "cmdline") }},
		{"status missing", false, func(fs *fakeProcfs) { fs.remove(100, "status") }},
		{"memory already released", true, func(fs *fakeProcfs) { fs.write(100, "maps", "") }},
		{"exiting", true, func(fs *fakeProcfs) {
			fs.write(100, "stat", statLine(100, "app", 'R', 1, pfExiting, 500))
		}},
		{"zombie", true, func(fs *fakeProcfs) {
			fs.write(100, "stat", statLine(100, "app", 'Z', 1, 0, 500))
			fs.write(100, "maps", "")
			fs.remove(100, "exe")
		}},
		{"zombie leader, all threads dead", true, func(fs *fakeProcfs) {
			fs.write(100, "stat", statLine(100, "app", 'Z', 1, 0, 500))
			fs.write(100, "task/101/stat", statLine(101, "app", 'X', 1, 0, 500))
			fs.write(100, "maps", "")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newFakeProcfs(t)
			fs.add(base)
			tt.setup(fs)
			tab, clock := newTestTable(t, fs, Options{CommandLine: true})
			p, err := tab.Get(100)
			if !errors.Is(err, ErrGone) || p != nil {
				t.Fatalf("Get() = %+v, %v; want nil, ErrGone", p, err)
			}
			if !strings.Contains(err.Error(), "pid 100") {
				t.Errorf("error %q does not name the pid", err)
			}
			if tab.Len() != 0 || tab.Stats().Gone != 1 {
				t.Errorf("Len() = %d, Stats() = %+v; want nothing cached and 1 gone", tab.Len(), tab.Stats())
			}

			// A cached process found gone by the reload after an exec is
			// dropped.
			fs.add(base)
			if _, err := tab.Get(100); err != nil {
				t.Fatalf("Get() of the restored process = %v", err)
			}
			tt.setup(fs)
			tab.Exec(100)
			if p, err := tab.Get(100); !errors.Is(err, ErrGone) || p != nil {
				t.Errorf("Get() after Exec = %+v, %v; want nil, ErrGone", p, err)
			}
			if tab.Len() != 0 {
				t.Errorf("Len() = %d after a reload found the process gone, want 0", tab.Len())
			}
			if !tt.refreshSees {
				return
			}
			// Refresh reads only stat and maps; it notices what shows there.
			fs.add(base)
			if _, err := tab.Get(100); err != nil {
				t.Fatalf("Get() of the restored process = %v", err)
			}
			tt.setup(fs)
			clock.Advance(time.Second)
			if p, err := tab.Refresh(100); !errors.Is(err, ErrGone) || p != nil {
				t.Errorf("Refresh() = %+v, %v; want nil, ErrGone", p, err)
			}
			// The snapshot stays for the process's queued samples: only
			// Exit (its exit record) forgets it.
			if p, err := tab.Get(100); err != nil || p == nil {
				t.Errorf("Get() after a Refresh found the process gone = %+v, %v; want its snapshot", p, err)
			}
			tab.Exit(100)
			if tab.Len() != 0 {
				t.Errorf("Len() = %d after Exit, want 0", tab.Len())
			}
		})
	}
}

// A thread-group leader that called pthread_exit is a zombie while its
// threads run on; the process is read through a live thread.
func TestTableZombieLeaderWithLiveThread(t *testing.T) {
	fs := newFakeProcfs(t)
	fs.add(fakeProc{pid: 100, comm: "app", state: 'Z', start: 500, maps: "", threads: map[int]string{101: "worker"}})
	fs.write(100, "task/101/maps", mapsText(textInit))
	if err := os.Symlink("/bin/app", filepath.Join(fs.dir(100), "task/101/exe")); err != nil {
		t.Fatal(err)
	}
	fs.write(100, "task/101/environ", "OTEL_SERVICE_NAME=svc\x00")
	fs.write(100, "task/101/cmdline", "/bin/app\x00-v\x00")
	fs.write(100, "task/101/stat", statLine(101, "worker", 'S', 1, 0, 500))
	// The thread's own status names the thread, not the process: the
	// namespace PID comes from the leader's.
	fs.write(100, "status", statusText(100, 0, "app", 1))
	fs.write(100, "task/101/status", statusText(101, 0, "worker", 2))
	tab, _ := newTestTable(t, fs, Options{CommandLine: true})
	got, err := tab.Get(100)
	if err != nil {
		t.Fatalf("Get() = %v", err)
	}
	want := &Process{PID: 100, PPID: 0, StartTime: 500, ExePath: "/bin/app", Name: "app", Comm: "app",
		ServiceName: "svc", CommandLine: "/bin/app -v", NamespacePID: 1,
		Mappings: []Mapping{textInit}, procfs: fs.root}
	if diff := cmp.Diff(want, got, cmpProcess); diff != "" {
		t.Errorf("Get() mismatch (-want +got):\n%s", diff)
	}
}

// mkfifo replaces a procfs file by a FIFO, so a test can act in the middle
// of the table reading that file: the reader's open blocks until the test
// opens the other end.
func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(path, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
}

// serveFIFO opens path for writing (waiting for the reader), runs during,
// writes content and closes. It reports errors on errc.
func serveFIFO(path, content string, during func()) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if during != nil {
		during()
	}
	_, err = f.WriteString(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// replaceWhileReadingMaps serves first to the next reader of pid 100's
// maps (the FIFO maps) and, while it reads, replaces the process's image
// with python3 mapping textNew, which it serves to the read after: as a
// new process at the pid (reuse: started at 9000), else as an exec. then,
// if set, runs after the change, before the first read ends. The channel
// tells how serving went.
func replaceWhileReadingMaps(t *testing.T, fs *fakeProcfs, maps, first string, reuse bool, then func()) <-chan error {
	errc := make(chan error, 1)
	go func() {
		err := serveFIFO(maps, first, func() {
			if reuse {
				fs.write(100, "stat", statLine(100, "python3", 'S', 1, 0, 9000))
			}
			if err := errors.Join(
				os.Remove(filepath.Join(fs.dir(100), "exe")),
				os.Symlink("/usr/bin/python3", filepath.Join(fs.dir(100), "exe")),
				// A fresh FIFO for the retry, so the second write cannot
				// reach the first reader.
				os.Remove(maps),
				unix.Mkfifo(maps, 0o644),
			); err != nil {
				t.Error(err)
			}
			if then != nil {
				then()
			}
		})
		if err == nil {
			err = serveFIFO(maps, mapsText(textNew), nil)
		}
		errc <- err
	}()
	return errc
}

func TestTableChangeMidRead(t *testing.T) {
	base := fakeProc{pid: 100, comm: "app", start: 500, exe: "/bin/app", maps: mapsText(textInit)}

	t.Run("exit while reading maps", func(t *testing.T) {
		fs := newFakeProcfs(t)
		fs.add(base)
		maps := filepath.Join(fs.dir(100), "maps")
		mkfifo(t, maps)
		tab, _ := newTestTable(t, fs, Options{})
		errc := make(chan error, 1)
		go func() {
			errc <- serveFIFO(maps, mapsText(textInit), func() { fs.remove(100, "stat") })
		}()
		p, err := tab.Get(100)
		if serr := <-errc; serr != nil {
			t.Fatal(serr)
		}
		if !errors.Is(err, ErrGone) || p != nil {
			t.Fatalf("Get() = %+v, %v; want nil, ErrGone", p, err)
		}
		if tab.Len() != 0 {
			t.Errorf("Len() = %d, want nothing cached", tab.Len())
		}
	})

	t.Run("pid reused while reading maps", func(t *testing.T) {
		fs := newFakeProcfs(t)
		fs.add(base)
		maps := filepath.Join(fs.dir(100), "maps")
		mkfifo(t, maps)
		tab, _ := newTestTable(t, fs, Options{})
		errc := replaceWhileReadingMaps(t, fs, maps, mapsText(textInit), true, nil)
		p, err := tab.Get(100)
		if err != nil {
			// Unblock the helper if the table gave up without a retry.
			if f, oerr := os.OpenFile(maps, os.O_RDONLY|syscall.O_NONBLOCK, 0); oerr == nil {
				f.Close()
			}
			t.Fatalf("Get() = %v (helper: %v)", err, <-errc)
		}
		if serr := <-errc; serr != nil {
			t.Fatal(serr)
		}
		want := &Process{PID: 100, PPID: 1, StartTime: 9000, ExePath: "/usr/bin/python3", Name: "python3",
			Comm: "python3", Mappings: []Mapping{textNew}, procfs: fs.root}
		if diff := cmp.Diff(want, p, cmpProcess); diff != "" {
			t.Errorf("Get() mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("pid reused while a refresh reads maps", func(t *testing.T) {
		// Refresh reads stat only after the maps: that read alone must
		// tell maps of another process from the cached one's.
		fs := newFakeProcfs(t)
		fs.add(base)
		tab, clock := newTestTable(t, fs, Options{})
		if _, err := tab.Get(100); err != nil {
			t.Fatalf("Get() = %v", err)
		}
		maps := filepath.Join(fs.dir(100), "maps")
		mkfifo(t, maps)
		errc := replaceWhileReadingMaps(t, fs, maps, mapsText(textInit, textLibc), true, nil)
		clock.Advance(time.Second)
		p, err := tab.Refresh(100)
		if err != nil {
			if f, oerr := os.OpenFile(maps, os.O_RDONLY|syscall.O_NONBLOCK, 0); oerr == nil {
				f.Close()
			}
			t.Fatalf("Refresh() = %v (helper: %v)", err, <-errc)
		}
		want := &Process{PID: 100, PPID: 1, StartTime: 9000, ExePath: "/usr/bin/python3", Name: "python3",
			Comm: "python3", Mappings: []Mapping{textNew}, procfs: fs.root}
		if diff := cmp.Diff(want, p, cmpProcess); diff != "" {
			// The helper still waits for the second read, which never came.
			t.Fatalf("Refresh() mismatch (-want +got):\n%s", diff)
		}
		if serr := <-errc; serr != nil {
			t.Fatal(serr)
		}
		if s := tab.Stats(); s.Reused != 1 {
			t.Errorf("Stats().Reused = %d, want 1", s.Reused)
		}
	})
}

// A caller that waits for another's read of a pid while the process execs
// reads the new image: the read it waited for may have seen the old one.
func TestTableWaiterAfterExecReadsAgain(t *testing.T) {
	base := fakeProc{pid: 100, comm: "app", start: 500, exe: "/bin/app", maps: mapsText(textInit)}
	fs := newFakeProcfs(t)
	fs.add(base)
	maps := filepath.Join(fs.dir(100), "maps")
	mkfifo(t, maps)
	tab, _ := newTestTable(t, fs, Options{})
	waiting := make(chan int, 1)
	tab.waiting = func(pid int) { waiting <- pid }

	type result struct {
		p   *Process
		err error
	}
	first, second := make(chan result, 1), make(chan result, 1)
	// The first read gets the old maps; meanwhile the process execs and a
	// second caller comes to wait for that read.
	errc := replaceWhileReadingMaps(t, fs, maps, mapsText(textInit), false, func() {
		tab.Exec(100)
		go func() {
			p, err := tab.Get(100)
			second <- result{p, err}
		}()
		<-waiting
	})
	go func() {
		p, err := tab.Get(100)
		first <- result{p, err}
	}()
	r := <-second
	if r.err != nil || r.p.ExePath != "/usr/bin/python3" {
		// The helper still waits for a second read, which never came.
		t.Fatalf("Get() waiting through an exec = %+v, %v; want the new image, /usr/bin/python3", r.p, r.err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Mapping{textNew}, r.p.Mappings); diff != "" {
		t.Errorf("mappings of the new image (-want +got):\n%s", diff)
	}
	if r := <-first; r.err != nil || r.p.ExePath != "/bin/app" {
		t.Errorf("the read the exec overtook = %+v, %v; want the old image it read", r.p, r.err)
	}
	if got, _ := tab.Get(100); got != r.p {
		t.Errorf("Get() after both = %+v, want the new image cached", got)
	}
}

func TestTableExit(t *testing.T) {
	fs := newFakeProcfs(t)
	fs.add(standardProcs()[0])
	tab, _ := newTestTable(t, fs, Options{})
	if _, err := tab.Get(1); err != nil {
		t.Fatalf("Get(1) = %v", err)
	}
	tab.Exit(1)
	tab.Exit(12345) // unknown pids are ignored
	if tab.Len() != 0 {
		t.Errorf("Len() = %d after Exit, want 0", tab.Len())
	}
	if _, err := tab.Get(1); err != nil {
		t.Fatalf("Get(1) after Exit = %v", err)
	}
	if s := tab.Stats(); s.Loads != 2 {
		t.Errorf("Stats().Loads = %d, want 2 (Exit forgot the process)", s.Loads)
	}
}

func TestTableMaxProcesses(t *testing.T) {
	fs := newFakeProcfs(t)
	for pid := 1; pid <= 5; pid++ {
		fs.add(fakeProc{pid: pid, comm: "p", start: uint64(pid), exe: "/bin/p", maps: mapsText(textInit)})
	}
	tab, _ := newTestTable(t, fs, Options{MaxProcesses: 3})
	cached := func() map[int]bool {
		tab.mu.RLock()
		defer tab.mu.RUnlock()
		m := map[int]bool{}
		for pid := range tab.entries {
			m[pid] = true
		}
		return m
	}
	for pid := 1; pid <= 4; pid++ {
		if _, err := tab.Get(pid); err != nil {
			t.Fatalf("Get(%d) = %v", pid, err)
		}
	}
	if tab.Len() != 3 || tab.Stats().Dropped != 1 {
		t.Fatalf("Len() = %d, Dropped = %d; want 3 and 1", tab.Len(), tab.Stats().Dropped)
	}
	// The eviction cleared the used marks of the survivors among 1..3. Use
	// one of them; the next eviction must take the other, unused one.
	var used, unused []int
	for pid := 1; pid <= 3; pid++ {
		if cached()[pid] {
			if len(used) == 0 {
				used = append(used, pid)
			} else {
				unused = append(unused, pid)
			}
		}
	}
	if len(used) != 1 || len(unused) != 1 {
		t.Fatalf("cached = %v, want two of pids 1..3", cached())
	}
	if _, err := tab.Get(used[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := tab.Get(5); err != nil {
		t.Fatal(err)
	}
	want := map[int]bool{used[0]: true, 4: true, 5: true}
	if diff := cmp.Diff(want, cached()); diff != "" {
		t.Errorf("cached pids mismatch (-want +got):\n%s", diff)
	}
	if s := tab.Stats(); s.Dropped != 2 || s.Loads != 5 {
		t.Errorf("Stats() = %+v, want 2 dropped and 5 loads", s)
	}

	// Scan stays within the bound too.
	tab2, _ := newTestTable(t, fs, Options{MaxProcesses: 2})
	if err := tab2.Scan(); err != nil {
		t.Fatal(err)
	}
	if tab2.Len() != 2 || tab2.Stats().Dropped != 3 {
		t.Errorf("after Scan: Len() = %d, Dropped = %d; want 2 and 3", tab2.Len(), tab2.Stats().Dropped)
	}
}

func TestTableUnreadableProcess(t *testing.T) {
	fs := newFakeProcfs(t)
	fs.add(fakeProc{pid: 100, comm: "app", start: 500, exe: "/bin/app"})
	// A directory in place of maps fails to read with EISDIR: an error that
	// is not "gone", like EACCES for an unprivileged agent.
	fs.remove(100, "maps")
	fs.write(100, "maps/x", "")
	tab, clock := newTestTable(t, fs, Options{RefreshInterval: 100 * time.Millisecond})

	_, err := tab.Get(100)
	if err == nil || errors.Is(err, ErrGone) {
		t.Fatalf("Get() = %v, want an error other than ErrGone", err)
	}
	for range 10 {
		if _, again := tab.Get(100); again == nil || again.Error() != err.Error() {
			t.Fatalf("Get() of an unreadable pid = %v, want the remembered %v", again, err)
		}
	}
	if s := tab.Stats(); s.Loads != 1 || s.Errors != 1 || tab.Len() != 0 {
		t.Errorf("Stats() = %+v, Len() = %d; want 1 load, 1 error, nothing cached", s, tab.Len())
	}
	clock.Advance(100 * time.Millisecond)
	fs.remove(100, "maps")
	fs.write(100, "maps", mapsText(textInit))
	if _, err := tab.Get(100); err != nil {
		t.Errorf("Get() once readable and the interval passed = %v", err)
	}
}

func TestTableRefreshFailureKeepsSnapshot(t *testing.T) {
	fs := newFakeProcfs(t)
	fs.add(standardProcs()[0])
	tab, clock := newTestTable(t, fs, Options{})
	orig, err := tab.Get(1)
	if err != nil {
		t.Fatal(err)
	}
	fs.write(1, "maps", "garbage\n")
	clock.Advance(time.Second)
	if _, err := tab.Refresh(1); err == nil || errors.Is(err, ErrGone) {
		t.Fatalf("Refresh() with malformed maps = %v, want an error other than ErrGone", err)
	}
	if got, err := tab.Get(1); err != nil || got != orig {
		t.Errorf("Get() after a failed refresh = %p, %v; want the previous snapshot %p", got, err, orig)
	}
}

func TestProcessFilePath(t *testing.T) {
	fs := newFakeProcfs(t)
	p := standardProcs()[1]
	fs.add(p)
	// map_files holds an entry for the deleted executable only.
	target := filepath.Join(t.TempDir(), "server")
	if err := os.WriteFile(target, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	mf := filepath.Join(fs.dir(100), "map_files", "400000-500000")
	if err := os.Symlink(target, mf); err != nil {
		t.Fatal(err)
	}
	tab, _ := newTestTable(t, fs, Options{})
	proc, err := tab.Get(100)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(fs.root, "100", "root")
	if got := proc.Root(); got != root {
		t.Errorf("Root() = %q, want %q", got, root)
	}
	tests := []struct {
		name string
		m    Mapping
		want string
	}{
		{"map_files entry", textApp, mf},
		{"through the root", textLibc, root + "/usr/lib/libc.so.6"},
		{"deleted without map_files entry", Mapping{Start: 1, End: 2, Path: "/gone", Deleted: true}, ""},
		{"anonymous", heap, ""},
		{"vdso", vdso, ""},
		{"unclean path", Mapping{Start: 1, End: 2, Path: "/usr/../../etc/shadow"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := proc.FilePath(tt.m); got != tt.want {
				t.Errorf("FilePath() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestFindMapping(t *testing.T) {
	p := &Process{Mappings: []Mapping{textApp, textInit, textLibc, vdso}}
	tests := []struct {
		addr uint64
		want Mapping
		ok   bool
	}{
		{0x3fffff, Mapping{}, false},
		{0x400000, textApp, true},
		{0x4fffff, textApp, true},
		{0x500000, Mapping{}, false},
		{0x55555555, textInit, true},
		{0x7f0000026000, textLibc, true},
		{0x7f000017bfff, textLibc, true},
		{0x7ffd00000001, vdso, true},
		{^uint64(0), Mapping{}, false},
		{0, Mapping{}, false},
	}
	for _, tt := range tests {
		got, ok := p.FindMapping(tt.addr)
		if ok != tt.ok {
			t.Errorf("FindMapping(%#x) ok = %v, want %v", tt.addr, ok, tt.ok)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("FindMapping(%#x) mismatch (-want +got):\n%s", tt.addr, diff)
		}
	}
	if _, ok := (&Process{}).FindMapping(1); ok {
		t.Errorf("FindMapping on a process without mappings found one")
	}
}

func TestThreadNameFake(t *testing.T) {
	fs := newFakeProcfs(t)
	fs.add(standardProcs()[1])
	if got, err := ThreadName(fs.root, 100, 101); err != nil || got != "worker 1" {
		t.Errorf("ThreadName(100, 101) = %q, %v; want %q", got, err, "worker 1")
	}
	if _, err := ThreadName(fs.root, 100, 102); !errors.Is(err, ErrGone) {
		t.Errorf("ThreadName of a missing thread = %v, want ErrGone", err)
	}
}

// TestTableConcurrent runs every operation at once; under -race it checks
// the locking, and it checks that every snapshot handed out is whole.
func TestTableConcurrent(t *testing.T) {
	fs := newFakeProcfs(t)
	const n = 20
	for pid := 1; pid <= n; pid++ {
		fs.add(fakeProc{pid: pid, comm: "p", start: uint64(pid), exe: "/bin/p", maps: mapsText(textInit, textLibc)})
	}
	tab := NewTable(fs.root, nil, Options{MaxProcesses: n / 2, RefreshInterval: time.Nanosecond})
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := range 300 {
				pid := 1 + (i*7+w)%n
				var p *Process
				var err error
				switch (i + w) % 5 {
				case 0, 1:
					p, err = tab.Get(pid)
				case 2:
					p, err = tab.Refresh(pid)
				case 3:
					tab.Exec(pid)
				case 4:
					tab.Exit(pid)
				}
				if err != nil {
					errc <- err
					return
				}
				if p != nil && (p.PID != pid || len(p.Mappings) != 2) {
					errc <- errors.New("inconsistent snapshot")
					return
				}
			}
			if w == 0 {
				if err := tab.Scan(); err != nil {
					errc <- err
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if tab.Len() > n/2 {
		t.Errorf("Len() = %d, above MaxProcesses %d", tab.Len(), n/2)
	}
}

// Alive tells a running process from one that exited (or whose pid now
// belongs to another process) since it was read.
func TestProcessAlive(t *testing.T) {
	base := fakeProc{pid: 100, comm: "app", start: 500, exe: "/bin/app", maps: mapsText(textInit),
		threads: map[int]string{101: "worker"}}
	tests := []struct {
		name  string
		alive bool
		setup func(fs *fakeProcfs)
	}{
		{"running", true, func(*fakeProcfs) {}},
		{"leader exited, a thread runs on", true, func(fs *fakeProcfs) {
			fs.write(100, "stat", statLine(100, "app", 'Z', 1, 0, 500))
		}},
		{"reaped", false, func(fs *fakeProcfs) { fs.remove(100, "") }},
		{"zombie", false, func(fs *fakeProcfs) {
			fs.write(100, "stat", statLine(100, "app", 'Z', 1, 0, 500))
			fs.write(100, "task/101/stat", statLine(101, "worker", 'X', 1, 0, 500))
		}},
		{"exiting", false, func(fs *fakeProcfs) {
			fs.write(100, "stat", statLine(100, "app", 'R', 1, pfExiting, 500))
			fs.remove(100, "task/101")
		}},
		{"pid reused", false, func(fs *fakeProcfs) {
			fs.add(fakeProc{pid: 100, comm: "other", start: 900, exe: "/bin/other", maps: mapsText(textInit)})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newFakeProcfs(t)
			fs.add(base)
			tab, _ := newTestTable(t, fs, Options{})
			p, err := tab.Get(100)
			if err != nil {
				t.Fatal(err)
			}
			tt.setup(fs)
			err = p.Alive()
			if tt.alive && err != nil {
				t.Errorf("Alive() = %v, want nil", err)
			}
			if !tt.alive && !errors.Is(err, ErrGone) {
				t.Errorf("Alive() = %v, want ErrGone", err)
			}
		})
	}
}
