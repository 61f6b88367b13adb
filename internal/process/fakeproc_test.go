package process

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeProc describes one process of a fake procfs tree.
type fakeProc struct {
	pid     int
	ppid    int
	comm    string
	state   byte // default 'S'
	flags   uint64
	start   uint64
	exe     string // target of the exe symlink; "" for none
	maps    string
	cgroup  string
	environ string
	cmdline string
	// nspid is the NSpid line's PIDs after the host one; none means the
	// process lives in procfs's PID namespace.
	nspid   []int
	threads map[int]string // tid to comm; the leader is added
}

// fakeProcfs is a procfs tree under a test's temporary directory.
type fakeProcfs struct {
	t    *testing.T
	root string
}

func newFakeProcfs(t *testing.T) *fakeProcfs {
	t.Helper()
	root := filepath.Join(t.TempDir(), "proc")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	// Non-process entries a real procfs has, which a scan must ignore.
	for _, name := range []string{"self", "sys", "net"} {
		if err := os.Mkdir(filepath.Join(root, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return &fakeProcfs{t: t, root: root}
}

func (fs *fakeProcfs) dir(pid int) string { return filepath.Join(fs.root, strconv.Itoa(pid)) }

// add writes p, replacing any process with the same pid.
func (fs *fakeProcfs) add(p fakeProc) {
	fs.t.Helper()
	dir := fs.dir(p.pid)
	if err := os.RemoveAll(dir); err != nil {
		fs.t.Fatal(err)
	}
	if p.state == 0 {
		p.state = 'S'
	}
	fs.write(p.pid, "stat", statLine(p.pid, p.comm, p.state, p.ppid, p.flags, p.start))
	fs.write(p.pid, "comm", p.comm+"\n")
	fs.write(p.pid, "maps", p.maps)
	fs.write(p.pid, "cgroup", p.cgroup)
	fs.write(p.pid, "environ", p.environ)
	fs.write(p.pid, "cmdline", p.cmdline)
	fs.write(p.pid, "status", statusText(p.pid, p.ppid, p.comm, p.nspid...))
	if p.exe != "" {
		if err := os.Symlink(p.exe, filepath.Join(dir, "exe")); err != nil {
			fs.t.Fatal(err)
		}
	}
	threads := map[int]string{p.pid: p.comm}
	for tid, comm := range p.threads {
		threads[tid] = comm
	}
	for tid, comm := range threads {
		fs.write(p.pid, fmt.Sprintf("task/%d/comm", tid), comm+"\n")
		fs.write(p.pid, fmt.Sprintf("task/%d/stat", tid), statLine(tid, comm, p.state, p.ppid, p.flags, p.start))
	}
	if err := os.MkdirAll(filepath.Join(dir, "map_files"), 0o755); err != nil {
		fs.t.Fatal(err)
	}
}

// write writes a file of process pid, creating directories.
func (fs *fakeProcfs) write(pid int, name, content string) {
	fs.t.Helper()
	p := filepath.Join(fs.dir(pid), name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		fs.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		fs.t.Fatal(err)
	}
}

func (fs *fakeProcfs) remove(pid int, name string) {
	fs.t.Helper()
	if err := os.RemoveAll(filepath.Join(fs.dir(pid), name)); err != nil {
		fs.t.Fatal(err)
	}
}

// mapsText renders mappings as the kernel prints them.
func mapsText(ms ...Mapping) string {
	var b strings.Builder
	for _, m := range ms {
		path := m.Path
		if m.Deleted {
			path += deletedSuffix
		}
		fmt.Fprintf(&b, "%08x-%08x %s %08x %02x:%02x %-26d%s\n",
			m.Start, m.End, m.Perms, m.Offset, unix.Major(m.Dev), unix.Minor(m.Dev), m.Inode, path)
	}
	return b.String()
}

// statusText renders /proc/PID/status as the kernel prints it, up to the
// lines after NSpid. nested are the PIDs in the PID namespaces below
// procfs's, outermost first.
func statusText(pid, ppid int, comm string, nested ...int) string {
	nspid := strconv.Itoa(pid)
	for _, n := range nested {
		nspid += "\t" + strconv.Itoa(n)
	}
	return fmt.Sprintf("Name:\t%s\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t%d\nNgid:\t0\nPid:\t%d\nPPid:\t%d\n"+
		"TracerPid:\t0\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nFDSize:\t64\nGroups:\t\nNStgid:\t%s\nNSpid:\t%s\n"+
		"NSpgid:\t%s\nNSsid:\t%s\nKthread:\t0\nVmPeak:\t    2400 kB\n",
		comm, pid, pid, ppid, nspid, nspid, nspid, nspid)
}
