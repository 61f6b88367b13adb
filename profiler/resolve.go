//go:build linux

package profiler

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/symbolize"
	"github.com/sonde-dev/sonde/tracer"
)

// Bounds of the resolver's own caches. They hold what the per-sample path
// would otherwise rebuild for every frame.
const (
	maxKernelPCs = 1 << 16
)

// resolver turns the tracer's raw records into profile samples: it finds the
// process and mapping of every user PC, the file behind each mapping, and the
// names of every frame. Its methods are called from the resolver goroutine only,
// except endInterval.
type resolver struct {
	log    *zap.Logger
	procs  *process.Table
	syms   *symbolize.Symbolizer
	native bool // name native frames; Go and kernel frames are always named
	// unwinder answers which file the unwinder meant by a frame's file
	// handle, and which processes it has mappings for (the unwind Loader).
	unwinder fileHandles
	byHandle map[uint32]*handleEntry
	// vdso names frames in "[vdso]" mappings (nil: unnamed).
	vdso *symbolize.VDSO
	// holds are the files the preparer keeps open per process; the
	// resolver lets them go once it has processed the process's exit.
	holds *fileHolds
	// runtimes name the frames their walkers reported (nil: none).
	runtimes *runtimeSet

	procsByPID map[int]*procEntry
	kernelPCs  map[uint64]kernelEntry
	kernelMaps map[string]*profile.Mapping

	frames []profile.Frame // reused for every sample: the builder copies what it keeps
	// unstable is set by resolveProc when the sample's frames may come out
	// otherwise for the same record words and process entry (see
	// stackKey): a refresh that read new maps, a failed lookup, an exiting
	// process. unmapped is set when a file-backed frame was named through
	// the process's maps, the unwinder having no handle for it: once the
	// process is prepared, each such sample refreshes its maps first.
	unstable, unhandled bool
	// entries numbers the procEntries made (procEntry.gen).
	entries uint64
	key     []uint64 // stackKey's words, reused
	// gone holds the resource of each process that cannot be read any
	// more, so every sample of one process carries the same resource,
	// whichever thread it is of: a process gone before it could be read,
	// from its first sample on; and one whose exit was resolved, for its
	// samples taken while the kernel finished the exit, which come after
	// the exit record.
	gone map[int]goneProc
	// exited keeps, for exitTail, the entries of processes whose exit was
	// resolved, with their mappings and open files: the samples the
	// kernel takes while it finishes the exit (exit_mmap) come after the
	// exit record, when procfs no longer has the process. exitedOrder is
	// their pids by exit, oldest first.
	exited      map[int]exitedEntry
	exitedOrder []int

	// Stack snapshots (snapshot.go): a Finder per file, by file id, under
	// finderMu (endInterval drops their pages from another goroutine);
	// the walk's frames, reused for every snapshot.
	finderMu       sync.Mutex
	finders        map[elfx.FileID]*finderEntry
	tick           uint64
	debugDirs      []string
	checkSnapshots bool
	snapPCs        []uint64
	snapFlags      []tracer.FrameFlags
	snapFiles      []tracer.FileRef
	snapWanted     []elfx.FileID // the files a walk read rows of
	snapWants      []int         // and how many frames of each

	stats     resolverStats
	loggedErr atomic.Bool // a resolution error was logged this interval
}

type resolverStats struct {
	processGone   atomic.Uint64 // samples whose process was gone before it could be read
	unmapped      atomic.Uint64 // user frames no mapping covers, even after a refresh
	fpOutside     atomic.Uint64 // frame-pointer chains dropped where they left executable mappings
	truncated     atomic.Uint64 // samples whose user stack ended before its outermost frame
	fileErrors    atomic.Uint64 // mapped files that could not be opened or identified
	symbolizeErrs atomic.Uint64
	kernelUnnamed atomic.Uint64
	cacheResets   atomic.Uint64
	// Stack snapshots: samples that carried one, those unwound from it to
	// their root, and (checkSnapshots) those compared with the kernel's
	// own unwinding, and how many of them differed.
	snapshots, snapshotsWhole, snapshotsSpliced atomic.Uint64
	snapshotsCompared, snapshotsDiffer          atomic.Uint64
}

// procEntry is what the resolver derived from one *process.Process; it is
// rebuilt when the table hands out a new Process (exec, refresh, PID reuse).
// It holds a symbolizer Handle to every file of the process it has named
// frames in, so those files stay open (by descriptor) while the process is
// known, whatever becomes of the process's /proc entries; close releases
// them.
type procEntry struct {
	proc *process.Process
	// gen is unique to the entry among all the resolver made: a key of
	// repeated stacks names the entry by it (a pointer could be reused).
	gen      uint64
	resource profile.Resource
	mappings map[uint64]*fileEntry  // by mapping start
	files    map[fileKey]*fileEntry // each file of the process, opened once
	maps     map[uint64]*profile.Mapping
}

// close releases the entry's file handles.
func (e *procEntry) close() {
	for _, fe := range e.files {
		fe.handle.Release()
	}
	clear(e.files)
	clear(e.mappings)
}

// fileKey identifies a mapped file without a syscall: what /proc/PID/maps says.
type fileKey struct {
	dev, inode uint64
	path       string
}

type fileEntry struct {
	info   *symbolize.FileInfo
	handle *symbolize.Handle // nil for handle entries, which hold no reference
	err    error
}

// handleEntry is the file behind an unwinder file handle, with what the
// mapping its frames get when their process's own mapping is unknown
// (the process exited before its maps were read) is made of.
type handleEntry struct {
	fileEntry
	mapping profile.Mapping // File and build ids; the range is per process
	last    *profile.Mapping
}

// mappingAt is the mapping of the file for a frame at pc, which the
// unwinder placed at offset off in the file: the whole file, at the load
// bias pc-off the frame shows, so that addresses translate to the right
// file offsets (as pprof does it) even though the process's own mapping
// was never read. The file's real path names it.
func (he *handleEntry) mappingAt(pc, off uint64) *profile.Mapping {
	if off > pc {
		m := he.mapping
		return &m
	}
	start := pc - off
	if he.last != nil && he.last.Start == start {
		return he.last
	}
	m := he.mapping
	m.Start, m.Limit, m.Offset = start, start+uint64(max(he.info.Size, 1)), 0
	he.last = &m
	return he.last
}

// maxHandles bounds the resolver's handle cache.
const maxHandles = 4096

// fileHandles is what the resolver asks the unwind Loader.
type fileHandles interface {
	File(handle uint32) (elfx.FileID, bool)
	Prepared(pid int) bool
	// Want says a stack was unwound in user space through the file,
	// counting n times: its table is built once that happened often
	// enough.
	Want(id elfx.FileID, n int)
}

func newResolver(log *zap.Logger, procs *process.Table, syms *symbolize.Symbolizer, native bool,
	unwinder fileHandles) *resolver {
	return &resolver{
		log:        log,
		procs:      procs,
		syms:       syms,
		native:     native,
		unwinder:   unwinder,
		byHandle:   make(map[uint32]*handleEntry),
		procsByPID: make(map[int]*procEntry),
		kernelPCs:  make(map[uint64]kernelEntry),
		kernelMaps: make(map[string]*profile.Mapping),
		gone:       make(map[int]goneProc),
		exited:     make(map[int]exitedEntry),
		finders:    make(map[elfx.FileID]*finderEntry),
		vdso:       readVDSO(log),
	}
}

// readVDSO reads this process's vDSO, which names every 64-bit process's;
// nil (vDSO frames unnamed) when it cannot be read.
func readVDSO(log *zap.Logger) *symbolize.VDSO {
	v, err := symbolize.ReadVDSO("/proc")
	if err != nil {
		log.Info("vdso unreadable; its frames stay unnamed", zap.Error(err))
		return nil
	}
	return v
}

// maxGone bounds the resources kept for processes that cannot be read.
const maxGone = 4096

// goneProc is the resource of a process that cannot be read. exit is the
// time of its exit record once that was resolved (zero before): samples
// within exitTail of it are the process's last ones (the kernel finishing
// its exit), not a new process's that reused the pid.
type goneProc struct {
	res  *profile.Resource
	exit time.Time
}

const exitTail = 2 * time.Second

// resolve fills s from rec, finding its process in the table now.
func (r *resolver) resolve(rec *tracer.Record, s *profile.Sample) {
	p, err := r.procs.Get(int(rec.PID))
	r.resolveProc(rec, p, err, s)
}

// resolveProc fills s from rec of process p, as the table held it when rec
// was read; err says why there was none (the process was gone). s.Frames
// aliases a buffer the next call reuses.
func (r *resolver) resolveProc(rec *tracer.Record, p *process.Process, err error, s *profile.Sample) {
	*s = profile.Sample{
		Kind:       profile.OnCPU,
		TID:        int64(rec.TID),
		ThreadName: rec.Comm,
		CPU:        int64(rec.CPU),
		Time:       rec.Time,
		Value:      1,
	}
	r.frames = r.frames[:0]
	r.unstable, r.unhandled = false, false
	for _, pc := range rec.Kernel {
		r.frames = append(r.frames, r.kernelFrame(pc))
	}

	pid := int(rec.PID)
	x, exited := r.exited[pid]
	if exited {
		d := rec.Time.Sub(x.exit)
		exited = d >= -exitTail && d <= exitTail && (err != nil || p == x.e.proc)
	}
	if exited {
		// Taken while the process finished its exit: its last mappings
		// and files still name the frames.
		p, err = x.e.proc, nil
		r.unstable = true // by the time of the sample
	}
	if err != nil {
		r.unstable = true
		r.stats.processGone.Add(1)
		// A process that exited before we read it still has its samples,
		// named by what the kernel told us of its first one.
		s.Resource = r.goneResource(pid, rec.Comm, rec.Time)
		for i, pc := range rec.User {
			if rec.UserFlags[i]&tracer.FrameRuntime != 0 {
				r.frames = append(r.frames, r.runtimeFrame(pid, rec, i))
				continue
			}
			// The unwinder saw each frame's file: that still names it.
			fp := rec.UserFlags[i]&tracer.FrameFromFramePointer != 0
			he := r.handle(fileRef(rec, i).File)
			if he == nil && fp {
				// No file, and no mappings left to check the address
				// against: a frame-pointer word that may be data is not
				// shown (see resolveProc).
				r.stats.fpOutside.Add(1)
				break
			}
			f := profile.Frame{Type: profile.FrameNative, Address: pc, FramePointer: fp}
			if he != nil {
				f = r.namedFrame(&he.fileEntry, he.mappingAt(pc, fileRef(rec, i).Offset), pc, r.fileOffset(rec, i))
				f.FramePointer = fp
			}
			r.frames = append(r.frames, f)
		}
		r.markTruncated(rec)
		s.Frames = r.frames
		return
	}
	var entry *procEntry
	if exited {
		entry = x.e
	} else {
		entry = r.entry(pid, p)
	}
	s.Resource = &entry.resource

	refreshed := false
	for i, pc := range rec.User {
		if rec.UserFlags[i]&tracer.FrameRuntime != 0 {
			r.frames = append(r.frames, r.runtimeFrame(pid, rec, i))
			continue
		}
		// A caller frame is named at its return address minus one: the call
		// instruction, not the statement after it. Interrupted PCs (the leaf,
		// or code a signal interrupted) are named as they are.
		addr := pc
		if rec.UserFlags[i]&tracer.FrameInterrupted == 0 {
			addr--
		}
		m, ok := entry.proc.FindMapping(addr)
		h := fileRef(rec, i).File
		if he := r.handle(h); he != nil {
			// The unwinder named the file and offset at sampling time; the
			// process's mapping, if it still holds that file there, gives
			// the frame its mapping, else the file's own.
			off := fileRef(rec, i).Offset
			mapping := he.mappingAt(pc, off)
			if ok && m.Start-m.Offset == pc-off {
				r.file(entry, m)
				mapping = entry.maps[m.Start]
			}
			f := r.namedFrame(&he.fileEntry, mapping, pc, r.fileOffset(rec, i))
			f.FramePointer = rec.UserFlags[i]&tracer.FrameFromFramePointer != 0
			r.frames = append(r.frames, f)
			continue
		}
		// A file-backed frame the unwinder could not place in a prepared
		// process: its mapping changed since (dlclose, dlopen), so the
		// cached maps are suspect too.
		suspect := ok && m.FileBacked() && r.unwinder != nil && r.unwinder.Prepared(pid)
		if h != 0 {
			// A handle not known yet: the same words may be named
			// otherwise once it is.
			r.unstable = true
		}
		r.unhandled = r.unhandled || (ok && m.FileBacked() && r.unwinder != nil)
		if (!ok || suspect) && !refreshed {
			refreshed = true
			e, err := r.refresh(pid, rec.Time)
			// Maps read again name the frames anew (a new entry).
			r.unstable = r.unstable || err != nil || e != entry
			if err == nil {
				entry = e
				s.Resource = &entry.resource
				m, ok = entry.proc.FindMapping(addr)
			}
		}
		if !ok {
			r.unstable = true
			r.stats.unmapped.Add(1)
			if rec.UserFlags[i]&tracer.FrameFromFramePointer != 0 {
				// A frame-pointer chain that left the process's code walked
				// into data: this word and every caller after it are not
				// frames. The stack ends here, marked cut short.
				r.stats.fpOutside.Add(1)
				break
			}
			r.frames = append(r.frames, profile.Frame{Type: profile.FrameNative, Address: pc})
			continue
		}
		f := r.userFrame(entry, m, pc, addr)
		f.FramePointer = rec.UserFlags[i]&tracer.FrameFromFramePointer != 0
		r.frames = append(r.frames, f)
	}
	r.markTruncated(rec)
	s.Frames = r.frames
}

// TruncatedFrame is the root-side frame of a sample whose user stack ended
// before its outermost frame: a flame graph then shows the frames above it
// under [truncated], not as roots of their own.
const TruncatedFrame = "[truncated]"

// markTruncated appends the [truncated] frame when rec's user stack did
// not end where the unwind tables say a stack ends (the process's or
// thread's entry): it stopped at code without a usable rule, at memory it
// could not read, at the end of a frame-pointer chain (no table yet, or
// none), or at the frame limit.
func (r *resolver) markTruncated(rec *tracer.Record) {
	if len(rec.User) == 0 || rec.Flags&tracer.FlagUserComplete != 0 || endsAtStackRoot(r.frames) {
		return
	}
	r.stats.truncated.Add(1)
	r.frames = append(r.frames, profile.Frame{Lines: []profile.Line{{Function: TruncatedFrame}}})
}

// stackRoots are functions that only ever run as the outermost frame of a
// stack: a frame-pointer walk (before a file's table is in the kernel) that
// ended in one cut nothing off, though no table said the stack ends there.
var stackRoots = map[string]bool{
	"runtime.goexit": true, // under every goroutine
	"runtime.mstart": true, // every Go thread's system stack
	"_start":         true, // a program's first frame (glibc, musl)
	"clone3":         true, // glibc's threads (2.34 on)
	"__clone3":       true,
	"clone":          true, // glibc's threads before 2.34, and musl's
	"__clone":        true,
}

// endsAtStackRoot reports whether the outermost of frames is one of
// stackRoots.
func endsAtStackRoot(frames []profile.Frame) bool {
	if len(frames) == 0 {
		return false
	}
	lines := frames[len(frames)-1].Lines
	if len(lines) == 0 {
		return false
	}
	// The function itself is the last line (the others are inlined into
	// it); Go's assembly functions may carry their ABI suffix.
	return stackRoots[strings.TrimSuffix(lines[len(lines)-1].Function, ".abi0")]
}

func (r *resolver) userFrame(entry *procEntry, m process.Mapping, pc, addr uint64) profile.Frame {
	fe := r.file(entry, m)
	if m.Path == symbolize.VDSOPath {
		return r.vdsoFrame(entry.maps[m.Start], m, pc, addr)
	}
	return r.namedFrame(fe, entry.maps[m.Start], pc, m.FileOffset(addr))
}

// vdsoFrame is the frame at pc in the vDSO mapping m, named at addr (pc,
// or the call before a return address) by the host's vDSO image, which is
// the same in every 64-bit process. Code of the vDSO that no exported
// symbol covers (its static helpers: the image is stripped) is named
// "[vdso]", as is a vDSO whose size differs from the host's image (a
// 32-bit process's).
func (r *resolver) vdsoFrame(mapping *profile.Mapping, m process.Mapping, pc, addr uint64) profile.Frame {
	name := symbolize.VDSOPath
	if r.vdso != nil && m.End-m.Start == r.vdso.Size() {
		if n, ok := r.vdso.Lookup(addr - m.Start); ok {
			name = n
		}
	}
	return profile.Frame{Type: profile.FrameNative, Address: pc, Mapping: mapping,
		Lines: []profile.Line{{Function: name}}}
}

// fileOffset is where user frame i of rec is named in its file: at its
// offset, or one byte before for a return address (the call instruction).
func (r *resolver) fileOffset(rec *tracer.Record, i int) uint64 {
	off := fileRef(rec, i).Offset
	if rec.UserFlags[i]&tracer.FrameInterrupted == 0 && off > 0 {
		off--
	}
	return off
}

// fileRef is where the unwinder placed user frame i of rec (zero: nowhere).
func fileRef(rec *tracer.Record, i int) tracer.FileRef {
	if i < len(rec.UserFiles) {
		return rec.UserFiles[i]
	}
	return tracer.FileRef{}
}

// namedFrame is the frame at pc, named at offset in fe's file.
func (r *resolver) namedFrame(fe *fileEntry, mapping *profile.Mapping, pc, offset uint64) profile.Frame {
	f := profile.Frame{Type: profile.FrameNative, Address: pc, Mapping: mapping}
	if fe.err != nil {
		return f
	}
	if !fe.info.IsGo && !r.native {
		return f
	}
	lines, err := r.syms.Symbolize(fe.info.ID, offset)
	if err != nil {
		r.unstable = true
		r.stats.symbolizeErrs.Add(1)
		r.logOnce("symbolization failed", zap.String("file", fe.info.Path), zap.Error(err))
		if fe.info.IsGo {
			f.Type = profile.FrameGo
		}
		return f
	}
	// A Go binary built with cgo holds C code too: the pclntab, which
	// names only the Go code, tells them apart.
	switch {
	case len(lines) > 0 && lines[0].Go:
		f.Type = profile.FrameGo
	case !r.native:
		return f
	case len(lines) > 0 && lines[len(lines)-1].Rust:
		// The physical function (the outermost line) decides.
		f.Type = profile.FrameRust
	}
	f.Lines = lines
	return f
}

// handle returns the file the unwinder reported as h, or nil when h is 0 or
// no longer known (then the frame is resolved through the process's maps).
func (r *resolver) handle(h uint32) *handleEntry {
	if h == 0 || r.unwinder == nil {
		return nil
	}
	if he, ok := r.byHandle[h]; ok {
		return he
	}
	id, ok := r.unwinder.File(h)
	if !ok {
		return nil
	}
	info, ok := r.syms.Info(id)
	if !ok {
		return nil
	}
	he := &handleEntry{fileEntry: fileEntry{info: info}}
	he.mapping = profile.Mapping{
		File:       mappingName(info),
		GNUBuildID: info.GNUBuildID,
		GoBuildID:  info.GoBuildID,
		FileID:     info.ID.String(),
	}
	if len(r.byHandle) >= maxHandles {
		clear(r.byHandle)
		r.stats.cacheResets.Add(1)
	}
	r.byHandle[h] = he
	return he
}

// mappingName is a file's path as the process that mapped it saw it, never
// the /proc path it was opened through; "[unknown]" when it is not known.
func mappingName(info *symbolize.FileInfo) string {
	if info.Name != "" {
		return info.Name
	}
	if _, rel, ok := elfx.SplitProcRoot(info.Path); ok {
		return rel
	}
	return "[unknown]"
}

// file returns the identity of the file behind m, opening it once per file
// and process: the entry's Handle keeps it open while the entry lives. It
// also makes the profile mapping for m in this process.
func (r *resolver) file(entry *procEntry, m process.Mapping) *fileEntry {
	if fe, ok := entry.mappings[m.Start]; ok {
		return fe
	}
	key := fileKey{dev: m.Dev, inode: m.Inode, path: m.Path}
	fe, ok := entry.files[key]
	if !ok {
		fe = &fileEntry{}
		switch {
		case !m.FileBacked():
			fe.err = errNotFile
		default:
			// Found by inode while a handle holds it (the process may be
			// gone, and its /proc paths with it), else opened by path.
			fe.handle, fe.err = r.syms.OpenMapped(entry.proc.FilePath(m), m.Dev, m.Inode)
			if fe.err == nil {
				fe.info = fe.handle.FileInfo
			}
		}
		if fe.err != nil && !errors.Is(fe.err, errNotFile) {
			r.stats.fileErrors.Add(1)
			r.logOnce("cannot read mapped file; its frames stay unnamed", zap.String("file", m.Path), zap.Error(fe.err))
		}
		entry.files[key] = fe
	}
	entry.mappings[m.Start] = fe
	pm := &profile.Mapping{Start: m.Start, Limit: m.End, Offset: m.Offset, File: m.Path}
	if m.Deleted {
		pm.File += " (deleted)" // as the kernel shows it
	}
	if fe.info != nil {
		pm.GNUBuildID = fe.info.GNUBuildID
		pm.GoBuildID = fe.info.GoBuildID
		pm.FileID = fe.info.ID.String()
	}
	entry.maps[m.Start] = pm
	return fe
}

var errNotFile = errors.New("anonymous or special mapping")

// kernelEntry is a named kernel PC.
type kernelEntry struct {
	lines   []profile.Line
	mapping *profile.Mapping
}

func (r *resolver) kernelFrame(pc uint64) profile.Frame {
	ke, ok := r.kernelPCs[pc]
	if !ok {
		if k, err := r.syms.Kernel(); err == nil {
			if sym, found := k.Lookup(pc); found {
				ke = kernelEntry{lines: []profile.Line{{Function: sym.Name}}, mapping: r.kernelMapping(sym.Module)}
			}
		}
		if ke.lines == nil {
			r.stats.kernelUnnamed.Add(1)
		}
		if len(r.kernelPCs) >= maxKernelPCs {
			clear(r.kernelPCs)
			r.stats.cacheResets.Add(1)
		}
		r.kernelPCs[pc] = ke
	}
	return profile.Frame{Type: profile.FrameKernel, Address: pc, Lines: ke.lines, Mapping: ke.mapping}
}

// kernelMapping is the mapping of the core kernel ("[kernel.kallsyms]", as
// perf names it) or of one module ("[nf_tables]").
func (r *resolver) kernelMapping(module string) *profile.Mapping {
	name := "[kernel.kallsyms]"
	if module != "" {
		name = "[" + module + "]"
	}
	m, ok := r.kernelMaps[name]
	if !ok {
		m = &profile.Mapping{File: name}
		r.kernelMaps[name] = m
	}
	return m
}

// goneResource is the resource of pid, which could not be read for its
// sample taken at t: the one it had when its exit was resolved, if it
// exited just before t; else the one of a process gone before it was read,
// named comm if this is its first sample.
func (r *resolver) goneResource(pid int, comm string, t time.Time) *profile.Resource {
	if g, ok := r.gone[pid]; ok {
		if g.exit.IsZero() {
			return g.res
		}
		if d := t.Sub(g.exit); d >= -exitTail && d <= exitTail {
			return g.res
		}
	}
	res := &profile.Resource{PID: int64(pid), ExecutableName: comm}
	r.keepGone(pid, goneProc{res: res})
	return res
}

// keepGone sets pid's entry in r.gone, emptying the map first when it is
// full.
func (r *resolver) keepGone(pid int, g goneProc) {
	if _, ok := r.gone[pid]; !ok && len(r.gone) >= maxGone {
		clear(r.gone)
		r.stats.cacheResets.Add(1)
	}
	r.gone[pid] = g
}

func (r *resolver) refresh(pid int, captured time.Time) (*procEntry, error) {
	p, err := r.procs.RefreshSince(pid, captured)
	if err != nil {
		return nil, err
	}
	return r.entry(pid, p), nil
}

func (r *resolver) entry(pid int, p *process.Process) *procEntry {
	old, ok := r.procsByPID[pid]
	if ok && old.proc == p {
		return old
	}
	r.entries++
	e := &procEntry{
		proc: p,
		gen:  r.entries,
		resource: profile.Resource{
			PID:            int64(pid),
			ExecutableName: p.Name,
			ExecutablePath: p.ExePath,
			ContainerID:    p.ContainerID,
			ServiceName:    p.ServiceName,
			EnvVars:        p.Env,
			CommandLine:    p.CommandLine,
			NamespacePID:   int64(p.NamespacePID),
		},
		mappings: make(map[uint64]*fileEntry),
		files:    make(map[fileKey]*fileEntry),
		maps:     make(map[uint64]*profile.Mapping),
	}
	if ok {
		// The files the process still maps pass to the new entry with
		// their handles: they are the same files, held open, so their
		// inodes cannot have been reused. A process that loads and
		// unloads libraries is read again often, and opening each file
		// again costs a stat. The others are released.
		for _, m := range p.Mappings {
			key := fileKey{dev: m.Dev, inode: m.Inode, path: m.Path}
			if fe, held := old.files[key]; held && fe.err == nil {
				e.files[key] = fe
				delete(old.files, key)
			}
		}
		old.close()
	}
	r.procsByPID[pid] = e
	return e
}

func (r *resolver) exec(pid int) {
	// The reader has marked the image stale in the process table.
	r.forget(pid)
}

// exit forgets pid, which exited at t, once every sample queued before its
// exit is resolved. Its resource stays for the samples the kernel took
// while finishing the exit, which may come after (exitedProc).
func (r *resolver) exit(pid int, t time.Time) {
	var res *profile.Resource
	if e, ok := r.procsByPID[pid]; ok {
		c := e.resource
		res = &c
	} else if g, ok := r.gone[pid]; ok {
		res = g.res
	}
	r.procs.Exit(pid)
	if r.runtimes != nil {
		for _, rt := range r.runtimes.list {
			rt.forget(pid)
		}
	}
	e := r.procsByPID[pid]
	delete(r.procsByPID, pid)
	r.forget(pid)
	r.holds.release(pid)
	if res != nil {
		r.keepGone(pid, goneProc{res: res, exit: t})
	}
	r.expireExited(t)
	if e != nil {
		r.keepExited(pid, e, t)
	}
}

// maxExited bounds the exited processes' entries kept (exited).
const maxExited = 256

// exitedEntry is the entry of a process whose exit was resolved at exit.
type exitedEntry struct {
	e    *procEntry
	exit time.Time
}

// keepExited keeps e, of pid that exited at t, for exitTail; past
// maxExited the oldest goes.
func (r *resolver) keepExited(pid int, e *procEntry, t time.Time) {
	r.dropExited(pid)
	if len(r.exited) >= maxExited {
		r.expireExited(time.Time{})
	}
	r.exited[pid] = exitedEntry{e: e, exit: t}
	r.exitedOrder = append(r.exitedOrder, pid)
}

// expireExited closes the kept entries of processes that exited more than
// exitTail before t; with t zero, the oldest one at least.
func (r *resolver) expireExited(t time.Time) {
	n := 0
	for ; n < len(r.exitedOrder); n++ {
		pid := r.exitedOrder[n]
		x, ok := r.exited[pid]
		if ok && !t.IsZero() && t.Sub(x.exit) <= exitTail {
			break
		}
		if ok {
			delete(r.exited, pid)
			x.e.close()
		}
		if t.IsZero() && ok {
			n++
			break
		}
	}
	r.exitedOrder = r.exitedOrder[n:]
	if len(r.exitedOrder) == 0 {
		r.exitedOrder = nil // let the array go
	}
}

// dropExited closes the kept entry of pid, if any: its pid is used again.
func (r *resolver) dropExited(pid int) {
	if x, ok := r.exited[pid]; ok {
		delete(r.exited, pid)
		x.e.close()
	}
}

// forget drops what the resolver derived from pid and releases its files.
func (r *resolver) forget(pid int) {
	delete(r.gone, pid)
	r.dropExited(pid)
	if e, ok := r.procsByPID[pid]; ok {
		delete(r.procsByPID, pid)
		e.close()
	}
}

// close releases every file the resolver and the preparer hold open.
func (r *resolver) close() {
	for pid := range r.procsByPID {
		r.forget(pid)
	}
	for pid := range r.exited {
		r.dropExited(pid)
	}
	r.exitedOrder = nil
	r.closeFinders()
	r.holds.close()
}

// logOnce logs the first resolution problem of each interval.
func (r *resolver) logOnce(msg string, fields ...zap.Field) {
	if r.loggedErr.CompareAndSwap(false, true) {
		r.log.Warn(msg+" (further problems this interval are only counted)", fields...)
	}
}

// endInterval lets the next interval log its first problem again, and ages
// the file holds of processes whose exit record never reached the resolver.
// It returns the processes found gone without one, whose holds it released.
func (r *resolver) endInterval() (gone []int) {
	r.loggedErr.Store(false)
	gone = r.holds.tick()
	r.dropPages()
	return gone
}

// dropPagesEvery is how often the resolver lets go of the file pages its
// lookups read. Each read maps the 64 KiB around it (the kernel's fault-
// around), so a burst of new addresses, as at start-up, would otherwise
// hold megabytes of them until the interval ends; a dropped page costs a
// minor fault when it is read again.
const dropPagesEvery = 100 * time.Millisecond

// dropPages lets go of the pages of symbol data and unwind information
// that lookups read since the last call (see elfx.Image.DropPages).
func (r *resolver) dropPages() {
	r.syms.DropPages()
	r.dropFinderPages()
}

// runtimeFrame is frame i of rec, which a runtime's walker reported.
func (r *resolver) runtimeFrame(pid int, rec *tracer.Record, i int) profile.Frame {
	if r.runtimes == nil {
		return profile.Frame{Address: rec.User[i]}
	}
	f, named := r.runtimes.frame(pid, rec, i)
	if !named {
		r.unstable = true // the runtime may name it later
	}
	return f
}
