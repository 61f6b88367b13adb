package process

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ErrGone is matched (errors.Is) by the errors of reads about a process that
// no longer exists: it exited, was reaped, or exited while being read.
var ErrGone = errors.New("process gone")

// Process is a snapshot of one process (a thread group, keyed by its TGID).
// A *Process handed out by this package is never modified afterwards; treat
// it, its Mappings and its Env as read-only. It is safe for concurrent use.
type Process struct {
	PID  int
	PPID int
	// StartTime is field 22 of /proc/PID/stat (clock ticks since boot); with
	// PID it identifies a process across PID reuse.
	StartTime uint64
	// ExePath is the target of /proc/PID/exe, " (deleted)" removed; "" when
	// it cannot be read (kernel threads, no permission).
	ExePath    string
	ExeDeleted bool
	// Name is the base name of ExePath, or Comm when there is no ExePath.
	Name string
	// Comm is the command name of the thread-group leader.
	Comm         string
	KernelThread bool
	// CgroupPath is the cgroup v2 path, or on v1 and hybrid hosts when the
	// v2 path is the root, the most specific v1 path.
	CgroupPath string
	// ContainerID is "" for a process on the host.
	ContainerID string
	// ServiceName is what OTEL_SERVICE_NAME, or else service.name in
	// OTEL_RESOURCE_ATTRIBUTES, says in the process's initial environment
	// (see parseEnviron for the precedence and decoding rules).
	ServiceName string
	// Env holds the variables named in Options.EnvVars that the initial
	// environment sets; nil when none.
	Env map[string]string
	// CommandLine is /proc/PID/cmdline with its NULs made spaces, at most
	// maxCommandLineLen bytes; read only with Options.CommandLine.
	CommandLine string
	// NamespacePID is the process's PID in its own PID namespace (the last
	// NSpid entry of /proc/PID/status) when that namespace is nested below
	// the one procfs belongs to, as in a container; 0 when the process lives
	// in procfs's namespace, where its PID is PID. It is kept even when it
	// equals PID, which only says the two numbers coincide.
	NamespacePID int
	// Mappings are the executable mappings only, sorted by Start.
	Mappings []Mapping

	procfs string
}

// FindMapping returns the executable mapping that contains addr.
func (p *Process) FindMapping(addr uint64) (Mapping, bool) {
	ms := p.Mappings
	i, _ := slices.BinarySearchFunc(ms, addr, func(m Mapping, a uint64) int {
		switch {
		case m.End <= a:
			return -1
		case m.Start > a:
			return 1
		}
		return 0
	})
	if i < len(ms) && ms[i].Start <= addr && addr < ms[i].End {
		return ms[i], true
	}
	return Mapping{}, false
}

// Root returns the path of the process's root directory in procfs
// (<procfs>/PID/root): absolute paths the process sees resolve under it, which
// is how files inside a container's mount namespace are reached.
func (p *Process) Root() string {
	return filepath.Join(p.procfs, strconv.Itoa(p.PID), "root")
}

// MapsPath returns the path of the process's maps file (<procfs>/PID/maps).
func (p *Process) MapsPath() string {
	return filepath.Join(p.procfs, strconv.Itoa(p.PID), "maps")
}

// FilePath returns a path through which the agent can open the file behind
// m: /proc/PID/map_files/<start>-<end> when that works (it pins the very
// inode mapped, even if the file was deleted or replaced; opening it needs
// CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE), else <procfs>/PID/root/<m.Path>.
// It returns "" for mappings without a file (anonymous memory, "[vdso]"),
// for deleted files when map_files cannot be opened (the path would name
// another file or none), and for paths that are not clean absolute paths.
//
// The root path suits files of other mount namespaces (containers), whose
// maps paths are relative to the process's root; map_files also covers a
// file the kernel prints relative to the agent's root (a bind mount).
func (p *Process) FilePath(m Mapping) string {
	if !m.FileBacked() {
		return ""
	}
	mf := filepath.Join(p.procfs, strconv.Itoa(p.PID), "map_files",
		strconv.FormatUint(m.Start, 16)+"-"+strconv.FormatUint(m.End, 16))
	if _, err := os.Stat(mf); err == nil {
		return mf
	}
	if m.Deleted || path.Clean(m.Path) != m.Path {
		return ""
	}
	return p.Root() + m.Path
}

// Alive returns nil while p still runs: its pid exists with p's start time
// (not reused) and its leader, or another of its threads, has not exited.
// Otherwise the error matches ErrGone.
func (p *Process) Alive() error {
	r := reader{procfs: p.procfs}
	dir := r.dir(p.PID)
	st, err := r.stat(dir)
	if err != nil {
		return fmt.Errorf("pid %d: %w", p.PID, err)
	}
	if st.StartTime != p.StartTime {
		return fmt.Errorf("pid %d: %w: reused (start time %d, was %d)", p.PID, ErrGone, st.StartTime, p.StartTime)
	}
	if st.dead() || st.Flags&pfExiting != 0 {
		if _, err := liveThread(dir, p.PID); err != nil {
			return fmt.Errorf("pid %d: %w", p.PID, err)
		}
	}
	return nil
}

// ThreadName returns the name (comm) of thread tid of process pid, read from
// <procfs>/PID/task/TID/comm. The error matches ErrGone when the thread is
// gone.
func ThreadName(procfs string, pid, tid int) (string, error) {
	p := filepath.Join(procfs, strconv.Itoa(pid), "task", strconv.Itoa(tid), "comm")
	b, _, err := readFile(p, 256)
	if err != nil {
		return "", goneOr(fmt.Errorf("thread %d/%d name: %w", pid, tid, err))
	}
	return strings.TrimSuffix(string(b), "\n"), nil
}

// readFile reads at most limit bytes of the file at p. procfs files report
// size 0, so the size cannot be known before reading.
func readFile(p string, limit int64) (data []byte, truncated bool, err error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	data, err = io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, false, err
	}
	if int64(len(data)) > limit {
		return data[:limit], true, nil
	}
	return data, false, nil
}

// isGone reports whether err says the process (or thread) does not exist.
func isGone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH)
}

// goneOr wraps err with ErrGone when it says the process does not exist.
func goneOr(err error) error {
	if isGone(err) {
		return fmt.Errorf("%w: %w", ErrGone, err)
	}
	return err
}

// reader reads processes from one procfs tree. It holds no mutable state
// besides atomic counters and is safe for concurrent use.
type reader struct {
	procfs      string
	envWant     map[string]bool
	commandLine bool
	// malformed counts per-process details that could not be parsed and
	// were left out of an otherwise good read.
	malformed *atomic.Uint64
}

// maxLoadAttempts bounds the retries when a process changes while it is
// being read (PID reused, leader exited mid-read).
const maxLoadAttempts = 3

// errChanged marks an attempt that saw the process change while reading; the
// load is retried.
var errChanged = errors.New("changed while reading")

func (r *reader) dir(pid int) string { return filepath.Join(r.procfs, strconv.Itoa(pid)) }

func (r *reader) stat(dir string) (procStat, error) {
	b, truncated, err := readFile(filepath.Join(dir, "stat"), maxStatLen)
	if err != nil {
		return procStat{}, goneOr(fmt.Errorf("read stat: %w", err))
	}
	if truncated {
		return procStat{}, fmt.Errorf("read stat: longer than %d bytes", maxStatLen)
	}
	if len(b) == 0 {
		// A task being released can leave an empty read behind.
		return procStat{}, fmt.Errorf("%w: empty stat", ErrGone)
	}
	s, err := parseStat(b)
	if err != nil {
		return procStat{}, fmt.Errorf("read stat: %w", err)
	}
	return s, nil
}

// load reads process pid from scratch. A process that exits while it is read
// yields an error matching ErrGone, never a partly filled Process.
func (r *reader) load(pid int) (*Process, error) {
	var err error
	for range maxLoadAttempts {
		var p *Process
		p, err = r.loadOnce(pid)
		if !errors.Is(err, errChanged) {
			if err != nil {
				return nil, fmt.Errorf("pid %d: %w", pid, err)
			}
			return p, nil
		}
	}
	return nil, fmt.Errorf("pid %d: %w: %w", pid, ErrGone, err)
}

func (r *reader) loadOnce(pid int) (*Process, error) {
	dir := r.dir(pid)
	st, err := r.stat(dir)
	if err != nil {
		return nil, err
	}
	p := &Process{
		PID:       pid,
		PPID:      st.PPID,
		StartTime: st.StartTime,
		Comm:      st.Comm,
		procfs:    r.procfs,
	}
	if st.kernelThread() {
		p.KernelThread = true
		p.Name = st.Comm
		return p, nil
	}
	// The per-process files that go through the memory map (exe, maps,
	// environ) are empty for a leader that exited while its other threads
	// run on; read those through a live thread instead.
	base := dir
	if st.dead() {
		tid, err := liveThread(dir, pid)
		if err != nil {
			return nil, err
		}
		base = filepath.Join(dir, "task", strconv.Itoa(tid))
	}

	if err := r.readExe(p, base); err != nil {
		return nil, err
	}
	if b, _, err := readFile(filepath.Join(dir, "cgroup"), maxCgroupLen); err == nil {
		cg := parseCgroup(string(b))
		p.CgroupPath, p.ContainerID = cg.Path, cg.ContainerID
	} else if isGone(err) {
		return nil, goneOr(fmt.Errorf("read cgroup: %w", err))
	}
	if err := r.readEnviron(p, base); err != nil {
		return nil, err
	}
	if r.commandLine {
		b, truncated, err := readFile(filepath.Join(base, "cmdline"), maxCommandLineLen)
		if err == nil {
			p.CommandLine = parseCmdline(b, truncated)
		} else if isGone(err) {
			return nil, goneOr(fmt.Errorf("read cmdline: %w", err))
		}
	}
	// The leader's own status: a thread's NSpid would be the thread's id.
	if err := r.readNamespacePID(p, dir); err != nil {
		return nil, err
	}
	if p.Mappings, err = readExecMappings(base); err != nil {
		return nil, err
	}
	if _, err := r.verify(dir, st.StartTime, base != dir); err != nil {
		return nil, err
	}
	return p, nil
}

// refresh re-reads the mappings of old and returns a new Process that shares
// everything else with it. When the pid now belongs to another process (its
// start time differs) it loads that one from scratch, and reused reports it.
//
// The maps are read first and stat once after them: that one read tells
// both that the maps were the process's own (its start time, and a leader
// not exiting) and its name now. A pid reused, or a leader that exited (its
// maps read empty), fails that check and is loaded from scratch.
func (r *reader) refresh(old *Process) (p *Process, reused bool, err error) {
	if old.KernelThread {
		p, err = r.load(old.PID)
		return p, err == nil && p.StartTime != old.StartTime, err
	}
	dir := r.dir(old.PID)
	ms, err := readExecMappings(dir)
	var st procStat
	if err == nil {
		st, err = r.verify(dir, old.StartTime, false)
	}
	if errors.Is(err, errChanged) {
		p, err = r.load(old.PID)
		return p, err == nil && p.StartTime != old.StartTime, err
	}
	if err != nil {
		return nil, false, fmt.Errorf("pid %d: %w", old.PID, err)
	}
	cp := *old
	cp.Comm = st.Comm
	cp.Mappings = ms
	return &cp, false, nil
}

// verify re-reads the stat of the process after its other files were read:
// the files belong to the process first seen only if it still exists with the
// same start time and (unless read through a live thread) the leader is not
// exiting. It returns the stat it read.
func (r *reader) verify(dir string, startTime uint64, viaThread bool) (procStat, error) {
	st, err := r.stat(dir)
	if err != nil {
		return st, err
	}
	if st.StartTime != startTime {
		return st, fmt.Errorf("%w: start time %d, was %d", errChanged, st.StartTime, startTime)
	}
	if !viaThread && (st.dead() || st.Flags&pfExiting != 0) {
		// Either the whole process is exiting, or only the leader and the
		// next attempt reads through a live thread.
		return st, fmt.Errorf("%w: leader exiting (state %c)", errChanged, st.State)
	}
	return st, nil
}

// readEnviron fills the service name and the wanted variables from the
// initial environment at <base>/environ. A process whose environment this
// agent may not read keeps neither; only a process that is gone is an error.
func (r *reader) readEnviron(p *Process, base string) error {
	b, truncated, err := readFile(filepath.Join(base, "environ"), maxEnvironLen)
	if err != nil {
		if isGone(err) {
			return goneOr(fmt.Errorf("read environ: %w", err))
		}
		return nil
	}
	if truncated {
		// Drop the variable cut in half by the bound.
		if i := bytes.LastIndexByte(b, 0); i >= 0 {
			b = b[:i]
		} else {
			b = nil
		}
	}
	e := parseEnviron(b, r.envWant)
	p.Env, p.ServiceName = e.env, e.service
	if e.badResourceAttributes {
		r.malformed.Add(1)
	}
	return nil
}

// readNamespacePID fills NamespacePID from <dir>/status.
func (r *reader) readNamespacePID(p *Process, dir string) error {
	b, _, err := readFile(filepath.Join(dir, "status"), maxStatusLen)
	if err != nil {
		if isGone(err) {
			return goneOr(fmt.Errorf("read status: %w", err))
		}
		return nil
	}
	pids, found, err := parseNSpid(b)
	switch {
	case err != nil:
		r.malformed.Add(1)
	case found && len(pids) > 1:
		p.NamespacePID = pids[len(pids)-1]
	}
	return nil
}

func (r *reader) readExe(p *Process, base string) error {
	exe, err := os.Readlink(filepath.Join(base, "exe"))
	switch {
	case err == nil:
		p.ExePath, p.ExeDeleted = strings.CutSuffix(exe, deletedSuffix)
		p.Name = filepath.Base(p.ExePath)
	case isGone(err):
		return goneOr(fmt.Errorf("read exe: %w", err))
	default:
		// No permission to follow the link: name the process by comm.
		p.Name = p.Comm
	}
	return nil
}

// readExecMappings reads the executable mappings of <base>/maps, sorted by
// start address: asked of the kernel one at a time where it can
// (queryExecMappings), else from the text. A user process always has
// mappings; none means its memory is already gone.
func readExecMappings(base string) ([]Mapping, error) {
	f, err := os.Open(filepath.Join(base, "maps"))
	if err != nil {
		return nil, goneOr(fmt.Errorf("read maps: %w", err))
	}
	defer f.Close()
	if ms, ok, err := queryExecMappings(f); ok {
		if err != nil {
			return nil, goneOr(fmt.Errorf("read maps: %w", err))
		}
		return slices.Clip(ms), nil
	}
	var ms []Mapping
	n, err := parseMaps(f, func(m *Mapping) {
		if m.Executable() {
			ms = append(ms, *m)
		}
	})
	if err != nil {
		return nil, goneOr(fmt.Errorf("read maps: %w", err))
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: empty maps", errChanged)
	}
	if !slices.IsSortedFunc(ms, cmpStart) {
		slices.SortFunc(ms, cmpStart)
	}
	return slices.Clip(ms), nil
}

func cmpStart(a, b Mapping) int {
	switch {
	case a.Start < b.Start:
		return -1
	case a.Start > b.Start:
		return 1
	}
	return 0
}

// liveThread returns a thread of process pid that has not exited.
func liveThread(dir string, pid int) (int, error) {
	f, err := os.Open(filepath.Join(dir, "task"))
	if err != nil {
		return 0, goneOr(fmt.Errorf("list threads: %w", err))
	}
	defer f.Close()
	// Only a bounded number of threads is examined: a process whose leader
	// exited and whose first threads are all dead too is treated as gone.
	const maxThreads = 64
	names, err := f.Readdirnames(maxThreads)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, goneOr(fmt.Errorf("list threads: %w", err))
	}
	for _, name := range names {
		tid, err := strconv.Atoi(name)
		if err != nil || tid == pid {
			continue
		}
		b, _, err := readFile(filepath.Join(dir, "task", name, "stat"), maxStatLen)
		if err != nil {
			continue
		}
		if st, err := parseStat(b); err == nil && !st.dead() {
			return tid, nil
		}
	}
	return 0, fmt.Errorf("%w: leader exited and no live thread", ErrGone)
}
