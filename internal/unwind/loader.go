package unwind

import (
	"bytes"
	"cmp"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/tracer"
)

// Kernel is where the Loader puts tables and mappings: the tracer's maps.
// The rows given to LoadTable live in a build buffer outside the heap.
// LoadTable tells copied (if not nil) how many of them, a prefix, it has
// copied so far, all of them before it waits for the kernel to install the
// table; the rows are valid until that last call or until LoadTable
// returns, whichever comes first.
type Kernel interface {
	LoadTable(id uint32, rows []tracer.Row, copied func(n int)) error
	UnloadTable(id uint32) error
	SetMappings(pid uint32, old, mappings []tracer.Mapping) error
	ForgetProcess(pid uint32, old []tracer.Mapping) error
}

// Identify returns the content-derived id of the file at path (the
// symbolizer's identity cache answers it without rereading the file).
type Identify func(path string) (elfx.FileID, error)

// LoaderOptions bound the Loader.
type LoaderOptions struct {
	// BudgetBytes bounds the kernel memory of loaded tables; tables no
	// process maps any more are evicted, least recently used first, to make
	// room. Default DefaultBudgetBytes.
	BudgetBytes int64
	// DebugDirs are host directories searched for separate debug files
	// (<dir>/.build-id/xx/yyyy.debug, and <dir>/<file's dir>/<debuglink>)
	// whose .debug_frame fills what the file's own CFI lacks; they are
	// searched after /usr/lib/debug inside the process's root for files
	// seen through /proc/PID/root or /proc/PID/map_files. Default
	// ["/usr/lib/debug"]; a non-nil empty slice searches no host directory.
	DebugDirs []string
	// Background makes Prepare leave each new file's table to a background
	// goroutine, which builds them one at a time, smallest first, and loads
	// them into the kernel a few at a time. Until its table is loaded, a
	// file's frames use frame pointers. Building a big file's table takes
	// hundreds of milliseconds, and loading any table into the kernel waits
	// for an RCU grace period (tens to hundreds of milliseconds on a busy
	// host): done in Prepare, both would hold up the processes prepared
	// after it, whose files are mostly known already.
	Background bool
	// Since, when set, is asked by Prepare (on its caller's goroutine)
	// when the process being prepared first needed a table, or the zero
	// time; it stamps the files Prepare defers.
	Since func() time.Time
	// Loaded, when set, is called for each deferred table once it is
	// loaded, with its stamp (Since; zero without one), the processes
	// that map the file, and whether it was built on demand (Demand,
	// Want, WantProcess), without the Loader's lock held.
	Loaded func(since time.Time, pids []int, onDemand bool)
	// Demand, when set, makes tables lazy: Prepare builds the table of a
	// new file only where Demand(its unwind information's bytes) is 0;
	// another file's table is built in the background (with Background)
	// once Want has been called for it that many times. Until then its
	// frames are unwound in user space, from the stack snapshots the eBPF
	// side takes where it has no table: a file that is seldom sampled (an
	// idle daemon, the agent itself) never costs the build of a table of
	// a million rows, nor its memory.
	Demand func(unwindBytes int64) int
}

// DefaultBudgetBytes is the default bound on table memory in the kernel.
const DefaultBudgetBytes = 128 << 20

// tableBytes is the kernel memory a table of n array entries (rows and
// page index: tracer.TableEntries) is counted as.
func tableBytes(n int) int64 { return tracer.TableKernelBytes(n) }

// LoaderStats are the Loader's counters; they only grow, except the gauges.
type LoaderStats struct {
	Tables     int   // gauge: tables loaded in the kernel
	Rows       int64 // gauge: rows loaded
	Bytes      int64 // gauge: kernel bytes of loaded tables (rows and overhead)
	Processes  int   // gauge: processes prepared
	Built      uint64
	Evicted    uint64
	NoCFI      uint64 // files without CFI: their frames use frame pointers
	OverBudget uint64 // tables that did not fit in the budget even after eviction
	// Refused is a gauge: files mapped by running processes whose table
	// did not fit; their frames use frame pointers until room frees, when
	// they are built and loaded again.
	Refused int
	Retried uint64 // refused tables loaded later, once room freed
	// Deferred counts the files Prepare left to the background
	// (LoaderOptions.Background); BuiltLater the tables loaded there (also
	// counted in Built). Pending is a gauge: files waiting to be built or
	// loaded there.
	Deferred   uint64
	BuiltLater uint64
	Pending    int
	Failures   uint64 // files that could not be read or parsed
	DebugFiles uint64 // tables built with a separate debug file's .debug_frame
	// Lazy is a gauge: files known without a table for want of demand
	// (LoaderOptions.Demand); OnDemand counts the tables built once they
	// were wanted enough.
	Lazy     int
	OnDemand uint64
}

// Loader keeps the eBPF unwinder's tables and per-process mappings in step
// with the processes being sampled. A file's table is built once, whatever
// the number of processes that map it, and stays loaded while any of them
// runs. It is safe for concurrent use.
type Loader struct {
	k        Kernel
	identify Identify
	log      *zap.Logger
	budget   int64
	debug    []string // DebugDirs

	mu     sync.Mutex
	files  map[elfx.FileID]*loadedFile
	procs  map[int][]procMapping
	ids    []uint32 // free table ids
	nextID uint32
	clock  uint64 // ticks on every use, for LRU eviction
	stats  LoaderStats
	// budgetLogged: the one log line saying the budget forced a fallback
	// was written.
	budgetLogged bool

	// Every file gets a handle the unwinder reports frames with. Handles
	// are never reused; those of evicted files are still answered for a
	// while (retired), as samples naming them may still be in flight.
	nextHandle uint32
	handles    map[uint32]elfx.FileID
	retired    []uint32

	// keys says which file's table the kernel holds under each file
	// identity (FileKernel).
	keys map[tracer.FileKey]*loadedFile

	// The files left to the background (LoaderOptions.Background), and
	// whether each lane's goroutine runs (buildDeferred); a lane ends when
	// nothing it takes is left. inBuild counts the files being built,
	// loading the tables being loaded; loads bounds those (maxLoads).
	background bool
	since      func() time.Time
	loaded     func(time.Time, []int, bool)
	demand     func(int64) int
	pending    []*deferredBuild
	building   [2]bool
	inBuild    int
	loading    int
	loads      chan struct{}
	idle       *sync.Cond // on mu: nothing is left to build or load
	closed     bool       // Close was called: nothing more is built or loaded
}

// deferredBuild is a file left to the background build.
type deferredBuild struct {
	id    elfx.FileID
	lf    *loadedFile
	size  int64 // its unwind information's bytes: the smallest go first
	since time.Time
	// onDemand: queued by Want, not by the Prepare of a new file.
	onDemand bool
	// ready: the Prepare that deferred it has set its process's mappings
	// (or given up), so a lane that finds no process mapping the file may
	// drop it. Before that, a lane already running would find none and
	// drop a file the process is about to map, which nothing asks for
	// again while the process runs.
	ready bool
}

// maxPendingBuilds bounds the files waiting for the background build;
// beyond it Prepare builds them itself. maxLoads bounds the tables being
// loaded at once: a load mostly waits for a grace period, which loads at
// the same time share, while it holds the table's rows.
const (
	maxPendingBuilds = 256
	maxLoads         = 4
)

// Background builds run in two lanes: the first takes any file, the second
// only files of at most smallUnwindBytes of unwind information, so that a
// new program's small table never waits for a big one's build (hundreds of
// milliseconds). At most two builds run at once.
const (
	laneAny          = 0
	laneSmall        = 1
	smallUnwindBytes = 1 << 20
)

// maxRetiredHandles bounds the handles of evicted files still answered.
const maxRetiredHandles = 4096

// loadedFile is a file's table: loaded in the kernel (id != 0) or known to
// be unusable (err != nil), with its segments. Rows are keyed by file
// offset minus base (fileRows).
type loadedFile struct {
	keys     []tracer.FileKey // identities the kernel holds its table under
	handle   uint32
	id       uint32
	rows     uint32
	base     uint64
	bytes    int64
	refs     int
	lastUsed uint64
	segments []segment
	debug    string // the separate debug file whose CFI the table uses
	err      error
	// refused: the table did not fit in the budget (err says so); need is
	// what it takes. Retried when processes that map it run and room frees.
	refused bool
	need    int64
	// deferred: its table is being built in the background (no table and
	// no error yet); it is not evicted meanwhile.
	deferred bool
	// loading: its table is going into the kernel under an id reserved
	// for it (Prepare waits for it); it is not evicted meanwhile.
	loading bool
	// lazy: no table is built until it is wanted (Want) wanted times;
	// size is its unwind information's bytes.
	lazy          bool
	wants, wanted int
	size          int64
}

// FileKernel is what a Kernel may also do: hold each file's table by the
// file's kernel identity, so the unwinder can use it in mappings no process
// entry covers yet (the tracer, on kernels with bpf_find_vma).
type FileKernel interface {
	SetFileTable(key tracer.FileKey, ft tracer.FileTable) error
	DeleteFileTable(key tracer.FileKey) error
}

// procMapping is one mapping as set for a process, with the file it uses
// and that file's kernel identity.
type procMapping struct {
	m     tracer.Mapping
	file  *loadedFile
	key   tracer.FileKey
	path  string // where the file is read, while the process runs
	start uint64 // the process's start time: a pid reused is another process
}

// NewLoader returns a Loader writing to k.
func NewLoader(k Kernel, identify Identify, log *zap.Logger, opts LoaderOptions) *Loader {
	if opts.BudgetBytes <= 0 {
		opts.BudgetBytes = DefaultBudgetBytes
	}
	if opts.DebugDirs == nil {
		opts.DebugDirs = []string{elfx.DefaultDebugDir}
	}
	l := &Loader{
		k:          k,
		identify:   identify,
		log:        log,
		budget:     opts.BudgetBytes,
		debug:      append([]string(nil), opts.DebugDirs...),
		files:      make(map[elfx.FileID]*loadedFile),
		procs:      make(map[int][]procMapping),
		nextID:     1,
		handles:    make(map[uint32]elfx.FileID),
		keys:       make(map[tracer.FileKey]*loadedFile),
		background: opts.Background,
		since:      opts.Since,
		loaded:     opts.Loaded,
		demand:     opts.Demand,
	}
	l.idle = sync.NewCond(&l.mu)
	l.loads = make(chan struct{}, maxLoads)
	return l
}

// Prepare loads the tables of every executable file p maps and sets p's
// mappings in the kernel, replacing what was set for it before. A file that
// cannot be used leaves its mapping to the frame-pointer walk.
//
// A process that is gone by the time its files are read (it exited, or its
// pid was reused) gets nothing set: what was set for it before is
// forgotten, and the error matches process.ErrGone.
func (l *Loader) Prepare(p *process.Process) error {
	// The files set for p before are held until the end, so those it
	// still maps can be used again (unchangedMapping) even if a Forget
	// meanwhile lets go of them.
	l.mu.Lock()
	prev := l.procs[p.PID]
	l.hold(prev)
	l.mu.Unlock()
	var next []procMapping
	// The tables of new files go into the kernel while the next file is
	// built: a load mostly waits for a grace period, which loads at the
	// same time share, and it does not hold l.mu meanwhile.
	var loads sync.WaitGroup
	for _, m := range p.Mappings {
		if !m.Executable() || !m.FileBacked() {
			continue
		}
		key := tracer.FileKey{Major: unix.Major(m.Dev), Minor: unix.Minor(m.Dev), Inode: m.Inode}
		// A mapping set before for this process keeps its file: the
		// same range of the same inode at the same offset. Processes
		// that map and unmap libraries all the time are prepared again
		// often, and finding each file again costs a stat and a look-up.
		path, lf := unchangedMapping(prev, p.StartTime, m, key)
		if lf == nil {
			if path = p.FilePath(m); path == "" {
				continue
			}
			lf = l.file(path, &loads)
		}
		pm := procMapping{m: tracer.Mapping{
			Start: m.Start, End: m.End,
			File: lf.handle, FileBias: m.Start - m.Offset, Inode: m.Inode,
		}, file: lf, key: key, path: path, start: p.StartTime}
		next = append(next, pm)
	}
	loads.Wait()
	// Its files vanish with the process: mappings set now would outlive it
	// if its exit was already handled, or its exit record lost. One that
	// exits after this check is forgotten on its exit.
	if err := p.Alive(); errors.Is(err, process.ErrGone) {
		l.mu.Lock()
		l.release(prev)
		l.queueDeferred()
		l.mu.Unlock()
		return errors.Join(fmt.Errorf("prepare unwinding: %w", err), l.Forget(p.PID))
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range next {
		pm := &next[i]
		pm.file.refs++
		l.clock++
		pm.file.lastUsed = l.clock
		// Read under the lock: a table built in the background may have
		// been loaded since file returned. The bias makes an address a PC
		// relative to the table's first row: rows are keyed by file offset.
		if lf := pm.file; lf.id != 0 {
			pm.m.Bias, pm.m.Table, pm.m.Rows = pm.m.FileBias+lf.base, lf.id, lf.rows
		} else {
			pm.m.NoTable = lf.never()
		}
	}
	old := l.procs[p.PID]
	err := l.k.SetMappings(uint32(p.PID), mappingsOf(old), mappingsOf(next))
	l.release(old)
	l.release(prev)
	l.procs[p.PID] = next
	l.stats.Processes = len(l.procs)
	err = errors.Join(err, l.setFileTables(next))
	l.queueDeferred()
	return err
}

// unchangedMapping returns the path and file of the mapping in prev (a
// process's mappings as set, ordered by start) that is m of the same
// process (started at start) with the same file: "", nil if there is none.
// A file that failed to open is not kept: the next attempt may succeed.
func unchangedMapping(prev []procMapping, start uint64, m process.Mapping, key tracer.FileKey) (string, *loadedFile) {
	i, ok := slices.BinarySearchFunc(prev, m.Start, func(pm procMapping, addr uint64) int {
		return cmp.Compare(pm.m.Start, addr)
	})
	if !ok {
		return "", nil
	}
	pm := &prev[i]
	if pm.start != start || pm.m.End != m.End || pm.m.FileBias != m.Start-m.Offset || pm.key != key || pm.file.handle == 0 {
		return "", nil
	}
	return pm.path, pm.file
}

// queueDeferred lets the lanes take the files deferred by the Prepare
// that calls it, now that the process's mappings are set or given up, and
// starts the lanes. (The preparer calls Prepare from one goroutine; two
// Prepares at once would let each other's files go early, as before
// there was a ready mark.) Called with l.mu held.
func (l *Loader) queueDeferred() {
	for _, d := range l.pending {
		d.ready = true
	}
	l.startBuilds()
}

// setFileTables gives the kernel the table of each file in pms it does not
// hold yet under that file's identity. Called with l.mu held.
func (l *Loader) setFileTables(pms []procMapping) error {
	fk, ok := l.k.(FileKernel)
	if !ok {
		return nil
	}
	var errs []error
	for _, pm := range pms {
		lf := pm.file
		if lf.handle == 0 || pm.key.Inode == 0 || l.keys[pm.key] == lf {
			continue
		}
		ft := tracer.FileTable{File: lf.handle}
		if lf.id != 0 {
			ft.Delta, ft.Table, ft.Rows = lf.delta(), lf.id, lf.rows
		}
		if err := fk.SetFileTable(pm.key, ft); err != nil {
			errs = append(errs, err)
			continue
		}
		l.keys[pm.key] = lf
		lf.keys = append(lf.keys, pm.key)
	}
	return errors.Join(errs...)
}

// dropFileTables removes lf's tables held by file identity. Called with
// l.mu held.
func (l *Loader) dropFileTables(lf *loadedFile) {
	fk, ok := l.k.(FileKernel)
	for _, key := range lf.keys {
		if l.keys[key] != lf {
			continue // claimed since by another content at that inode
		}
		delete(l.keys, key)
		if ok {
			if err := fk.DeleteFileTable(key); err != nil {
				l.log.Debug("removing a file's unwind table failed", zap.Error(err))
			}
		}
	}
	lf.keys = nil
}

// Forget removes pid's mappings; its tables stay loaded until evicted. The
// room this may free goes to the tables refused for lack of it that other
// running processes still need (retryRefused).
func (l *Loader) Forget(pid int) error {
	l.mu.Lock()
	old, ok := l.procs[pid]
	if !ok {
		l.mu.Unlock()
		return nil
	}
	delete(l.procs, pid)
	l.release(old)
	l.stats.Processes = len(l.procs)
	err := l.k.ForgetProcess(uint32(pid), mappingsOf(old))
	retry := l.stats.Refused > 0
	l.mu.Unlock()
	if retry {
		err = errors.Join(err, l.retryRefused())
	}
	return err
}

// retryRefused builds and loads again the refused tables that running
// processes map and that fit now beside the tables in use, and points
// those processes' mappings at them.
func (l *Loader) retryRefused() error {
	type job struct {
		id   elfx.FileID
		lf   *loadedFile
		path string
	}
	l.mu.Lock()
	free := l.budget - l.bytesInUse()
	var jobs []job
	for id, lf := range l.files {
		if !lf.refused || lf.refs == 0 || lf.need > free {
			continue
		}
		if path := l.pathOf(lf); path != "" {
			jobs = append(jobs, job{id, lf, path})
			free -= lf.need
		}
	}
	l.mu.Unlock()

	var errs []error
	for _, j := range jobs {
		errs = append(errs, l.retry(j.id, j.lf, j.path))
	}
	return errors.Join(errs...)
}

// retry builds the refused table of lf again from path and loads it, if it
// is still refused and mapped.
func (l *Loader) retry(id elfx.FileID, lf *loadedFile, path string) error {
	built, rows, mem := buildFile(path, l.debug, l.log)
	defer mem.run()
	if built.err != nil {
		return nil // its process went away, or the file changed: stays refused
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.files[id] != lf || !lf.refused || lf.refs == 0 {
		return nil
	}
	if err := l.load(lf, rows, loadProgress(rows, mem, nil)); err != nil {
		lf.err = err
		return nil
	}
	lf.err, lf.refused = nil, false
	lf.base, lf.segments, lf.debug = built.base, built.segments, built.debug
	l.stats.Refused--
	l.stats.Retried++
	return l.repoint(lf)
}

// bytesInUse is the kernel memory of the tables running processes map,
// which eviction cannot free. Called with l.mu held.
func (l *Loader) bytesInUse() int64 {
	var n int64
	for _, lf := range l.files {
		if lf.refs > 0 && lf.id != 0 {
			n += lf.bytes
		}
	}
	return n
}

// pathOf returns where a running process maps lf. Called with l.mu held.
func (l *Loader) pathOf(lf *loadedFile) string {
	for _, pms := range l.procs {
		for _, pm := range pms {
			if pm.file == lf && pm.path != "" {
				return pm.path
			}
		}
	}
	return ""
}

// forgetPath stops offering path to read lf from: the mappings of lf
// reached through it keep their table, but pathOf gives another process's
// path. Called with l.mu held.
func (l *Loader) forgetPath(lf *loadedFile, path string) {
	for _, pms := range l.procs {
		for i := range pms {
			if pms[i].file == lf && pms[i].path == path {
				pms[i].path = ""
			}
		}
	}
}

// never reports whether lf will never have a table: its build failed for
// another reason than the budget (which may free room), and is not to be
// tried again.
func (lf *loadedFile) never() bool {
	return lf.err != nil && !lf.refused && !lf.deferred && lf.id == 0
}

// remap applies set to the mapping of lf in every process that maps it,
// and sets those processes' mappings again. Called with l.mu held.
func (l *Loader) remap(lf *loadedFile, set func(pm *procMapping)) error {
	var errs []error
	for pid, pms := range l.procs {
		var next []procMapping
		for i, pm := range pms {
			if pm.file != lf {
				continue
			}
			if next == nil {
				next = slices.Clone(pms)
			}
			set(&next[i])
		}
		if next == nil {
			continue
		}
		if err := l.k.SetMappings(uint32(pid), mappingsOf(pms), mappingsOf(next)); err != nil {
			errs = append(errs, err)
		}
		l.procs[pid] = next
	}
	return errors.Join(errs...)
}

// repoint sets the mappings of lf, whose table was just loaded, in every
// process that maps it, and in the kernel's file tables. Called with l.mu
// held.
func (l *Loader) repoint(lf *loadedFile) error {
	errs := []error{l.remap(lf, func(pm *procMapping) {
		pm.m.Bias, pm.m.Table, pm.m.Rows, pm.m.NoTable = pm.m.FileBias+lf.base, lf.id, lf.rows, false
	})}
	if fk, ok := l.k.(FileKernel); ok {
		ft := tracer.FileTable{File: lf.handle, Delta: lf.delta(), Table: lf.id, Rows: lf.rows}
		for _, key := range lf.keys {
			if l.keys[key] == lf {
				errs = append(errs, fk.SetFileTable(key, ft))
			}
		}
	}
	return errors.Join(errs...)
}

// Prepared reports whether pid's mappings are set.
func (l *Loader) Prepared(pid int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.procs[pid]
	return ok
}

// File returns the id of the file the unwinder reports as handle.
func (l *Loader) File(handle uint32) (elfx.FileID, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id, ok := l.handles[handle]
	return id, ok
}

// retire keeps answering for handle until maxRetiredHandles newer ones were
// retired. Called with l.mu held.
func (l *Loader) retire(handle uint32) {
	l.retired = append(l.retired, handle)
	if len(l.retired) > maxRetiredHandles {
		delete(l.handles, l.retired[0])
		l.retired = l.retired[1:]
	}
}

// Stats returns the Loader's counters.
func (l *Loader) Stats() LoaderStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

// hold takes a reference to the file of each of pms. Called with l.mu
// held.
func (l *Loader) hold(pms []procMapping) {
	for _, pm := range pms {
		pm.file.refs++
	}
}

func (l *Loader) release(pms []procMapping) {
	for _, pm := range pms {
		pm.file.refs--
	}
}

func mappingsOf(pms []procMapping) []tracer.Mapping {
	ms := make([]tracer.Mapping, len(pms))
	for i, pm := range pms {
		ms[i] = pm.m
	}
	return ms
}

// file returns the table of the file at path, building it on first use
// and loading it into the kernel in a goroutine loads waits for. Building
// and loading happen outside the lock; two processes racing for a new
// file may both parse it, and the second result is dropped.
func (l *Loader) file(path string, loads *sync.WaitGroup) *loadedFile {
	id, err := l.identify(path)
	if err != nil {
		return &loadedFile{err: err}
	}
	l.mu.Lock()
	if lf, ok := l.files[id]; ok {
		l.clock++
		lf.lastUsed = l.clock
		l.mu.Unlock()
		return lf
	}
	l.mu.Unlock()

	size := unwindBytes(path)
	if l.demand != nil {
		if n := l.demand(size); n > 0 {
			return l.lazyFile(id, size, n)
		}
	}
	if l.background {
		if lf := l.deferFile(id, size); lf != nil {
			return lf
		}
	}
	lf, rows, mem := buildFile(path, l.debug, l.log)
	if vanished(lf.err) {
		// The path went away with its process between identify and
		// here: nothing is wrong with the file, so it is not recorded as
		// unusable for the next process that maps it.
		mem.run()
		return lf
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if existing, ok := l.files[id]; ok {
		mem.run()
		return existing
	}
	l.add(id, lf)
	if !l.counted(lf, path) {
		mem.run()
		return lf
	}
	tid, need, err := l.reserve(lf, tracer.TableEntries(rows))
	if err != nil {
		l.loadFailed(lf, tracer.TableEntries(rows), path, err)
		mem.run()
		return lf
	}
	lf.loading = true
	loads.Add(1)
	go func() {
		defer loads.Done()
		n, entries := len(rows), tracer.TableEntries(rows) // rows go with mem
		err := l.k.LoadTable(tid, rows, loadProgress(rows, mem, nil))
		mem.run()
		l.mu.Lock()
		defer l.mu.Unlock()
		lf.loading = false
		if err = l.commit(lf, tid, n, need, err); err != nil {
			l.loadFailed(lf, entries, path, err)
		}
	}()
	return lf
}

// add records lf as file id's, with a new handle. Called with l.mu held.
func (l *Loader) add(id elfx.FileID, lf *loadedFile) {
	l.clock++
	lf.lastUsed = l.clock
	l.files[id] = lf
	l.nextHandle++
	if l.nextHandle == 0 {
		l.nextHandle++
	}
	lf.handle = l.nextHandle
	l.handles[lf.handle] = id
}

// counted counts what building lf gave, and reports whether it has rows to
// load. Called with l.mu held.
func (l *Loader) counted(lf *loadedFile, path string) bool {
	if lf.debug != "" {
		l.stats.DebugFiles++
	}
	switch {
	case errors.Is(lf.err, ErrNoCFI):
		l.stats.NoCFI++
		return false
	case lf.err != nil:
		l.stats.Failures++
		l.log.Debug("no unwind table for file; frame pointers there", zap.String("file", path), zap.Error(lf.err))
		return false
	}
	return true
}

// loadFailed records that lf's table of n rows could not be loaded. Called
// with l.mu held.
func (l *Loader) loadFailed(lf *loadedFile, n int, path string, err error) {
	lf.err = err
	if errors.Is(err, errNoRoom) {
		lf.refused, lf.need = true, tableBytes(n)
		l.stats.Refused++
		if !l.budgetLogged {
			l.budgetLogged = true
			l.log.Warn("unwind table budget full: files beyond it are unwound by frame pointers until room frees; raise limits::unwind_table_bytes (counted in the over-budget table failures, logged once)",
				zap.String("file", path), zap.Int64("table_bytes", lf.need), zap.Int64("budget_bytes", l.budget), zap.Int64("used_bytes", l.stats.Bytes))
		}
	}
	l.log.Debug("unwind table not loaded; frame pointers there", zap.String("file", path), zap.Error(err))
}

// deferFile records file id as being built in the background and queues
// its build, or returns nil when the queue is full (the caller builds it).
func (l *Loader) deferFile(id elfx.FileID, size int64) *loadedFile {
	var since time.Time
	if l.since != nil {
		since = l.since()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if existing, ok := l.files[id]; ok {
		return existing
	}
	if len(l.pending) >= maxPendingBuilds {
		return nil
	}
	lf := &loadedFile{deferred: true}
	l.add(id, lf)
	l.pending = append(l.pending, &deferredBuild{id: id, lf: lf, size: size, since: since})
	l.stats.Deferred++
	l.countPending()
	return lf
}

// lazyFile records file id as known, without a table until it is
// wanted enough (Want).
func (l *Loader) lazyFile(id elfx.FileID, size int64, wanted int) *loadedFile {
	l.mu.Lock()
	defer l.mu.Unlock()
	if existing, ok := l.files[id]; ok {
		return existing
	}
	lf := &loadedFile{lazy: true, size: size, wanted: wanted}
	l.add(id, lf)
	l.stats.Lazy++
	return lf
}

// Want records that a stack was unwound in user space through file id for
// want of its table, counting n times toward the file's demand; the call
// that reaches it queues its build. It does nothing for a file that is not
// lazy (its table is built, being built, or cannot be).
func (l *Loader) Want(id elfx.FileID, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if lf, ok := l.files[id]; ok && lf.lazy {
		if lf.wants += n; lf.wants >= lf.wanted {
			l.buildLazy(id, lf)
		}
	}
}

// WantProcess queues the build of every lazy file pid maps, at once: its
// stacks are not snapshotted (a CPython process, whose walker needs the
// eBPF side's frames), so they would never be wanted.
func (l *Loader) WantProcess(pid int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, pm := range l.procs[pid] {
		if id, ok := l.handles[pm.file.handle]; ok && pm.file.lazy {
			l.buildLazy(id, pm.file)
		}
	}
}

// buildLazy queues the build of lazy file id. Called with l.mu held.
func (l *Loader) buildLazy(id elfx.FileID, lf *loadedFile) {
	lf.lazy = false
	l.stats.Lazy--
	if l.closed {
		return
	}
	lf.deferred = true
	l.pending = append(l.pending, &deferredBuild{id: id, lf: lf, size: lf.size, onDemand: true, ready: true})
	l.stats.Deferred++
	l.countPending()
	l.startBuilds()
}

// startBuilds starts the lanes that have files to take. Called with l.mu
// held.
func (l *Loader) startBuilds() {
	if l.closed {
		return
	}
	for lane := range l.building {
		if !l.building[lane] && l.next(lane) >= 0 {
			l.building[lane] = true
			go l.buildDeferred(lane)
		}
	}
}

// next returns the index in l.pending of the file lane takes next, the
// smallest, or -1. Called with l.mu held.
func (l *Loader) next(lane int) int {
	i := -1
	for j, d := range l.pending {
		if !d.ready || lane == laneSmall && d.size > smallUnwindBytes {
			continue
		}
		if i < 0 || d.size < l.pending[i].size {
			i = j
		}
	}
	return i
}

// countPending sets the Pending gauge. Called with l.mu held.
func (l *Loader) countPending() {
	l.stats.Pending = len(l.pending) + l.inBuild + l.loading
}

// buildDeferred builds the deferred files lane takes, smallest first,
// until none is left, and has each table loaded (loadDeferred). A file no
// running process maps any more is dropped unbuilt: the next process that
// maps it asks again.
func (l *Loader) buildDeferred(lane int) {
	for {
		l.mu.Lock()
		i := l.next(lane)
		if i < 0 {
			l.building[lane] = false
			l.idle.Broadcast()
			l.mu.Unlock()
			return
		}
		d := l.pending[i]
		l.pending = slices.Delete(l.pending, i, i+1)
		l.inBuild++
		path := l.pathOf(d.lf)
		l.mu.Unlock()

		var built *loadedFile
		var rows []tracer.Row
		var mem *releases // rows's buffers, run once they are loaded or dropped
		if path != "" {
			built, rows, mem = buildFile(path, l.debug, l.log)
		}

		l.mu.Lock()
		l.inBuild--
		lf := d.lf
		if l.closed {
			// The kernel side is going away: the table is not loaded.
			lf.deferred = false
			l.countPending()
			l.mu.Unlock()
			mem.run()
			continue
		}
		if path != "" && vanished(built.err) {
			// Not through this path any more (its process went away, or
			// the file was replaced): another process's, if one maps it.
			// Until the process's exit is handled its mappings stay, so
			// the path is forgotten here, or the next try would take it
			// again at once.
			l.forgetPath(lf, path)
		}
		if path != "" && vanished(built.err) && l.pathOf(lf) != "" {
			// Its process went away; another one maps it.
			l.pending = append(l.pending, d)
			l.countPending()
			l.mu.Unlock()
			mem.run()
			continue
		}
		if path == "" || vanished(built.err) {
			// Nothing maps it now: forget it, so that the next process
			// that maps it builds it.
			lf.deferred = false
			l.drop(d.id, lf)
			l.countPending()
			l.mu.Unlock()
			mem.run()
			continue
		}
		lf.base, lf.segments, lf.debug, lf.err = built.base, built.segments, built.debug, built.err
		if !l.counted(lf, path) {
			lf.deferred = false
			// No table will come: the processes that map it stop taking
			// stack snapshots there.
			if err := l.remap(lf, func(pm *procMapping) { pm.m.NoTable = true }); err != nil {
				l.log.Debug("cannot mark mappings without a table", zap.Error(err))
			}
			l.countPending()
			l.mu.Unlock()
			mem.run()
			continue
		}
		id, need, err := l.reserve(lf, tracer.TableEntries(rows))
		if err != nil {
			lf.deferred = false
			l.loadFailed(lf, tracer.TableEntries(rows), path, err)
			l.countPending()
			l.mu.Unlock()
			mem.run()
			continue
		}
		l.loading++
		l.mu.Unlock()
		l.loads <- struct{}{}
		// The lane takes its next file once these rows are in the kernel
		// and their buffer is gone, not after the install's grace period:
		// a big table's rows (7 MB for a big Go binary) are then never
		// held beside the next build's.
		filled := make(chan struct{})
		release := sync.OnceFunc(func() {
			mem.run()
			close(filled)
		})
		go func() {
			defer func() { <-l.loads }()
			defer release()
			l.loadDeferred(d, path, id, need, rows, loadProgress(rows, mem, release))
		}()
		<-filled
	}
}

// loadDeferred loads a deferred file's rows as table id, reserved for it,
// and points the processes that map the file at it.
func (l *Loader) loadDeferred(d *deferredBuild, path string, id uint32, need int64, rows []tracer.Row, copied func(int)) {
	n, entries := len(rows), tracer.TableEntries(rows) // rows may be gone after the load
	err := l.k.LoadTable(id, rows, copied)
	// Wait returns once the load is done and Loaded was told.
	defer func() {
		l.mu.Lock()
		l.loading--
		l.countPending()
		l.idle.Broadcast()
		l.mu.Unlock()
	}()
	l.mu.Lock()
	lf := d.lf
	lf.deferred = false
	l.countPending()
	if err = l.commit(lf, id, n, need, err); err != nil {
		l.loadFailed(lf, entries, path, err)
		l.mu.Unlock()
		return
	}
	l.stats.BuiltLater++
	if d.onDemand {
		l.stats.OnDemand++
	}
	err = l.repoint(lf)
	pids := l.mappers(lf)
	l.mu.Unlock()
	if err != nil {
		l.log.Debug("pointing processes at a file's unwind table failed", zap.String("file", path), zap.Error(err))
	}
	if l.loaded != nil {
		l.loaded(d.since, pids, d.onDemand)
	}
}

// Close stops the background builds before the kernel side (the tracer)
// is closed: the files still queued are dropped, a build under way is not
// loaded, and Close waits for the goroutines to end and for the loads
// already started. The Loader is not used after.
func (l *Loader) Close() {
	l.mu.Lock()
	l.closed = true
	for _, d := range l.pending {
		d.lf.deferred = false
	}
	l.pending = nil
	l.countPending()
	l.mu.Unlock()
	l.Wait()
}

// Wait waits until the tables left to the background are built and
// loaded, or given up.
func (l *Loader) Wait() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.building[laneAny] || l.building[laneSmall] || l.loading > 0 {
		l.idle.Wait()
	}
}

// mappers returns the processes that map lf. Called with l.mu held.
func (l *Loader) mappers(lf *loadedFile) []int {
	var pids []int
	for pid, pms := range l.procs {
		if slices.ContainsFunc(pms, func(pm procMapping) bool { return pm.file == lf }) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Pending reports whether a file pid maps waits for its table to be built
// in the background.
func (l *Loader) Pending(pid int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.procs[pid], func(pm procMapping) bool { return pm.file.deferred })
}

// drop forgets file id, which has no table, and no process maps. Called
// with l.mu held.
func (l *Loader) drop(id elfx.FileID, lf *loadedFile) {
	if l.files[id] == lf {
		delete(l.files, id)
	}
	l.dropFileTables(lf)
	l.retire(lf.handle)
}

// unwindBytes is the size of the unwind information of the ELF file at
// path (.eh_frame, .debug_frame, .gopclntab), read from its section
// headers; 0 when it cannot tell.
func unwindBytes(path string) int64 {
	f, err := elf.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	var n int64
	for _, name := range []string{".eh_frame", ".debug_frame", ".gopclntab"} {
		if s := f.Section(name); s != nil && s.Type != elf.SHT_NOBITS {
			n += int64(s.Size)
		}
	}
	return n
}

// vanished reports whether err says a path through procfs no longer
// exists (its process exited).
func vanished(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

// buildFile parses the file's CFI into kernel rows, with the .debug_frame
// of its separate debug file (searched in debugDirs) where the file has no
// .debug_frame of its own. The rows live in mem (nil with no rows), which
// the caller runs once they are loaded or given up.
func buildFile(path string, debugDirs []string, log *zap.Logger) (*loadedFile, []tracer.Row, *releases) {
	f, err := elfx.OpenFile(path)
	if err != nil {
		return &loadedFile{err: err}, nil, nil
	}
	defer f.Close()
	// The file is read through a read-only mapping: a Go binary's pclntab
	// (40 MB in the agent's own) is then parsed in place, in the page
	// cache, instead of being copied into the heap for each build.
	st, err := f.Stat()
	if err != nil {
		return &loadedFile{err: fmt.Errorf("%s: %w", path, err)}, nil, nil
	}
	img, err := elfx.MapImage(f, st.Size())
	if err != nil {
		return &loadedFile{err: err}, nil, nil
	}
	defer img.Unmap() // the rows built below copy what they keep
	ef, err := elf.NewFile(bytes.NewReader(img.Bytes()))
	if err != nil {
		return &loadedFile{err: fmt.Errorf("%s: %w", path, err)}, nil, nil
	}
	lf := &loadedFile{segments: loadSegments(ef)}
	var debug *elf.File
	if !hasSection(ef, ".debug_frame") {
		df, err := elfx.FindDebugFile(ef, elfx.ViewOf(path), debugDirs)
		if err != nil {
			log.Debug("debug file lookup", zap.String("file", path), zap.Error(err))
		}
		if df != nil {
			defer func() { _ = df.Close() }() // read only
			if hasSection(df.ELF, ".debug_frame") {
				debug, lf.debug = df.ELF, df.Path
			}
		}
	}
	t, err := fromFile(ef, img.Bytes(), debug, img.DropPages)
	if err != nil && debug != nil && !errors.Is(err, ErrNoCFI) {
		// A broken debug file must not cost the CFI the file itself has.
		log.Debug("unusable debug file", zap.String("file", path), zap.String("debug_file", lf.debug), zap.Error(err))
		lf.debug = ""
		t, err = fromFile(ef, img.Bytes(), nil, img.DropPages)
	}
	if err != nil {
		lf.err = err
		return lf, nil, nil
	}
	if startsPrograms(ef) {
		t = t.EndAtEntry(ef.Entry)
	}
	// t's rows live outside the heap: fileRows re-keys them and kernelRows
	// converts them in place, so the kernel rows are t's memory, released
	// once the caller has loaded them.
	byOffset, err := fileRows(t.Rows, lf.segments, &t.mem)
	if err != nil {
		t.release()
		lf.err = fmt.Errorf("%s: %w", path, err)
		return lf, nil, nil
	}
	rows, base, err := kernelRows(byOffset, &t.mem)
	if err != nil {
		t.release()
		lf.err = fmt.Errorf("%s: %w", path, err)
		return lf, nil, nil
	}
	lf.base = base
	// The kernel rows fill the first half of the rows they were made
	// from; the second half's pages go back now, not after the load,
	// which waits for the kernel (a big Go binary's: 7 MB of 14).
	t.mem.discardAfter(uintptr(unsafe.Pointer(unsafe.SliceData(rows))) + uintptr(len(rows))*unsafe.Sizeof(tracer.Row{}))
	return lf, rows, &t.mem
}

// startsPrograms reports whether f's entry point is where a process's
// first frame starts: an executable (it names an interpreter, or is not
// position-independent), or the dynamic loader itself (ld-*.so). Other
// shared libraries' entry points, which linkers often set to the start of
// .text, are no such thing.
func startsPrograms(f *elf.File) bool {
	if f.Type == elf.ET_EXEC {
		return true
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	soname, err := f.DynString(elf.DT_SONAME)
	return err == nil && len(soname) == 1 && strings.HasPrefix(soname[0], "ld-")
}

// hasSection reports whether f has a section name with content in the file.
func hasSection(f *elf.File, name string) bool {
	s := f.Section(name)
	return s != nil && s.Type != elf.SHT_NOBITS && s.Size > 0
}

// A kernel row is no larger than a Row, so kernelRows can write each over
// the rows it has read (this fails to compile otherwise).
var _ [unsafe.Sizeof(Row{}) - unsafe.Sizeof(tracer.Row{})]byte

// kernelRows converts a table to the eBPF side's compact rows, with PCs
// relative to the table's first row. It converts in place: the result
// shares rows' memory (row i is written over the first bytes of rows[i:]
// only after rows[i] was read), and rows must not be used after it. mem
// holds rows (nil: the heap): its pages are dropped as kernelRows goes.
func kernelRows(rows []Row, mem *releases) ([]tracer.Row, uint64, error) {
	if len(rows) == 0 {
		return nil, 0, ErrNoCFI
	}
	base := rows[0].PC
	out := unsafe.Slice((*tracer.Row)(unsafe.Pointer(unsafe.SliceData(rows))), len(rows))
	for i, r := range rows {
		if r.PC-base > 0xffffffff {
			return nil, 0, fmt.Errorf("unwind table spans more than 4 GiB")
		}
		out[i] = kernelRow(r, uint32(r.PC-base))
		mem.passed(i)
	}
	return out, base, nil
}

// kernelRow is r as the eBPF side's row at pc: where an offset does not fit
// the row's fields, the weaker rule that does.
func kernelRow(r Row, pc uint32) tracer.Row {
	var cfa uint8
	switch r.CFA {
	case CFASP:
		cfa = tracer.CFASP
	case CFAFP:
		cfa = tracer.CFAFP
	case CFAPLT:
		cfa = tracer.CFAPLT
	case CFASignal:
		cfa = tracer.CFASignal
	case CFAEnd:
		cfa = tracer.CFAEnd
	case CFASPLR:
		cfa = tracer.CFASPLR
	case CFASPRecord:
		cfa = tracer.CFASPRecord
	case CFAFPRecord:
		cfa = tracer.CFAFPRecord
	case CFASPRA:
		cfa = tracer.CFASPRA
	case CFASPGo:
		cfa = tracer.CFASPGo
	case CFAGoCgo:
		cfa = tracer.CFAGoCgo
	default:
		cfa = tracer.CFAUnknown
	}
	fp := tracer.FPUnknown
	switch r.FP {
	case FPSame:
		fp = tracer.FPSame
	case FPOffset:
		fp = tracer.FPOffset
	}
	kr, ok := tracer.MakeRow(pc, cfa, r.CFAOffset, fp, int32(r.FPOffset))
	if !ok && fp == tracer.FPOffset && cfa != tracer.CFASPRecord && cfa != tracer.CFAFPRecord {
		// The caller's RBP is out of the row's reach: unknown.
		kr, ok = tracer.MakeRow(pc, cfa, r.CFAOffset, tracer.FPUnknown, 0)
	}
	if !ok {
		kr, _ = tracer.MakeRow(pc, tracer.CFAUnknown, 0, tracer.FPUnknown, 0)
	}
	return kr
}

// loadProgress returns LoadTable's copied for rows held in mem: the pages
// of the rows copied so far go as the copy proceeds, and mem itself once
// every row is in; then done, if not nil, is called.
func loadProgress(rows []tracer.Row, mem *releases, done func()) func(int) {
	return func(n int) {
		if n < len(rows) {
			mem.drop()
			return
		}
		mem.run()
		if done != nil {
			done()
		}
	}
}

// errNoRoom: a table did not fit in the budget.
var errNoRoom = errors.New("unwind table budget full")

// load puts lf's rows in the kernel, evicting unreferenced tables if the
// budget needs it. Called with l.mu held, which it lets go of during the
// load itself (the kernel waits for an RCU grace period there); lf is
// marked loading meanwhile, so nothing evicts it.
func (l *Loader) load(lf *loadedFile, rows []tracer.Row, copied func(int)) error {
	id, need, err := l.reserve(lf, tracer.TableEntries(rows))
	if err != nil {
		return err
	}
	lf.loading = true
	l.mu.Unlock()
	err = l.k.LoadTable(id, rows, copied)
	l.mu.Lock()
	lf.loading = false
	return l.commit(lf, id, len(rows), need, err)
}

// reserve finds room and a table id for lf's table of n rows, evicting
// unreferenced tables if the budget needs it, and counts its bytes as used;
// commit then records the load's outcome. Called with l.mu held.
func (l *Loader) reserve(lf *loadedFile, n int) (id uint32, need int64, err error) {
	need = tableBytes(n)
	if need > l.budget {
		l.stats.OverBudget++
		return 0, 0, fmt.Errorf("table of %d bytes exceeds the %d-byte budget: %w", need, l.budget, errNoRoom)
	}
	for l.stats.Bytes+need > l.budget || len(l.ids) == 0 && l.nextID >= tracer.MaxTables {
		if !l.evictOne(lf) {
			l.stats.OverBudget++
			return 0, 0, fmt.Errorf("no room for a table of %d bytes: %d of %d bytes used by tables in use: %w", need, l.stats.Bytes, l.budget, errNoRoom)
		}
	}
	if k := len(l.ids); k > 0 {
		id, l.ids = l.ids[k-1], l.ids[:k-1]
	} else {
		id = l.nextID
		l.nextID++
	}
	l.stats.Bytes += need
	return id, need, nil
}

// commit records that lf's table of n rows was loaded as table id, or
// gives back what reserve took if loading failed (err). Called with l.mu
// held.
func (l *Loader) commit(lf *loadedFile, id uint32, n int, need int64, err error) error {
	if err != nil {
		l.ids = append(l.ids, id)
		l.stats.Bytes -= need
		l.stats.Failures++
		return err
	}
	lf.id, lf.rows, lf.bytes = id, uint32(n), need
	l.stats.Built++
	l.stats.Tables++
	l.stats.Rows += int64(n)
	return nil
}

// evictOne unloads the least recently used table no process maps, other
// than keep's (the file being loaded, not referenced yet). Called
// with l.mu held.
func (l *Loader) evictOne(keep *loadedFile) bool {
	var victim *loadedFile
	var victimID elfx.FileID
	for fid, lf := range l.files {
		if lf.refs == 0 && lf != keep && !lf.deferred && !lf.loading && (victim == nil || lf.lastUsed < victim.lastUsed) {
			victim, victimID = lf, fid
		}
	}
	if victim == nil {
		return false
	}
	delete(l.files, victimID)
	if victim.refused {
		l.stats.Refused--
	}
	if victim.lazy {
		l.stats.Lazy--
	}
	l.dropFileTables(victim)
	l.retire(victim.handle)
	if victim.id == 0 {
		return true // an unusable file's record: free to drop
	}
	if err := l.k.UnloadTable(victim.id); err != nil {
		l.log.Warn("unloading unwind table failed", zap.Error(err))
	}
	l.ids = append(l.ids, victim.id)
	l.stats.Evicted++
	l.stats.Tables--
	l.stats.Rows -= int64(victim.rows)
	l.stats.Bytes -= victim.bytes
	return true
}

// delta is what the unwinder adds to a mapping's start minus its file
// offset to get the bias of rows, in any mapping of the file: rows are keyed
// by file offset (fileRows), so it is the table's base.
func (lf *loadedFile) delta() int64 {
	return int64(lf.base)
}
