package symbolize

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/elfx"
)

// ErrUnknownFile is returned by Symbolize for a file id that Open never
// returned, or that has since been dropped from the bounded set of known
// files (Options.MaxKnownFiles); Open the file again.
var ErrUnknownFile = errors.New("unknown file id")

// Line is one named source position. Several lines for one address are
// inline levels, innermost first.
type Line struct {
	// Function is the display name: demangled and simplified as pprof
	// shows names (namespaces and class, no parameter list, no template
	// arguments, no return type).
	Function   string
	SystemName string // raw symbol name as in the binary (mangled), "" if same as Function
	File       string
	Line       int64
	// Go: named by the Go pclntab, so Go code. In a cgo binary (IsGo) the
	// C half is named from ELF symbols and DWARF and is not Go.
	Go bool
	// Rust: named from a symbol mangled as Rust mangles (v0, or legacy
	// with its hash segment), so Rust code.
	Rust bool
}

// ErrFileClosed is returned by Symbolize for a file whose symbol data is not
// loaded and that no Handle holds open any more: every process that mapped
// it is gone. Open it again through a process that maps it.
var ErrFileClosed = errors.New("file no longer open")

// FileInfo identifies an ELF file. It is shared by every caller that opens
// the same file and must not be modified.
type FileInfo struct {
	ID elfx.FileID
	// Path is the path it was first opened by (often /proc/PID/map_files/
	// START-END, valid only while that process lives). It is never used to
	// find the file again.
	Path string
	// Name is the file's path as the process that mapped it saw it (the
	// target of the map_files link, or the part after /proc/PID/root),
	// without the kernel's " (deleted)" suffix; "" when unknown.
	Name       string
	Size       int64 // bytes
	GNUBuildID string
	GoBuildID  string
	IsGo       bool // has a .gopclntab: Go code (and, with cgo, C code: see Line.Go)
}

// Handle is one counted reference to an open file: the file stays open (by
// its descriptor, not by path) until every Handle to it is released, so its
// symbol data can be loaded after the process it was opened through has
// exited. A Handle embeds the file's FileInfo. Release it once; further
// Releases do nothing.
type Handle struct {
	*FileInfo
	s        *Symbolizer
	k        *knownFile
	released atomic.Bool
}

// File returns the descriptor the file is held open by while h is not
// released (nil if it has none): a reader that must find the very file h
// names, whatever became of the path it was opened by.
func (h *Handle) File() *os.File {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	return h.k.fd
}

// Release drops this reference. When it was the last one the file's
// descriptor is closed; its loaded symbol data stays cached within the
// budget, so a file run again soon is not loaded again.
func (h *Handle) Release() {
	if h == nil || !h.released.CompareAndSwap(false, true) {
		return
	}
	h.s.mu.Lock()
	fd := h.s.unrefLocked(h.k)
	h.s.mu.Unlock()
	if fd != nil {
		_ = fd.Close()
	}
}

// Options bounds the Symbolizer's memory. Zero fields take the defaults.
type Options struct {
	MaxFiles int // how many files' symbol data stay loaded (LRU); default 256
	// MaxSymbolBytes bounds all the data symbolization derives and holds,
	// heap and the mappings inflated DWARF and the kernel's symbols are
	// kept in (spilled to unlinked temporary files where the temporary
	// directory is on disk, whose pages then leave RSS once read, else
	// anonymous memory; elfx.MapSpill): the indexes
	// of loaded files (symbol index, inflated sections, MiniDebugInfo
	// names, parsed line programs and inline trees), the (file, offset)
	// cache, the kernel's symbols and the known files. Symbol tables,
	// pclntabs and uncompressed DWARF are read in place from read-only
	// mappings of the files (page cache, not heap) and are not counted.
	// The least recently used files are dropped past it. Default 64 MiB.
	MaxSymbolBytes int64
	// MaxDWARFBytes is the largest total of .debug_* sections indexed for
	// line numbers in one file; bigger files are named from symbols only,
	// as are files whose DWARF index would take more than half of
	// MaxSymbolBytes before any unit is parsed. Default 32 MiB.
	MaxDWARFBytes int64
	// MaxInflateBytes bounds what one file may inflate: MiniDebugInfo and
	// compressed DWARF sections together. A section past it is refused
	// (Stats.InflateRefused) and the file is named without it. Default
	// 32 MiB, at most a quarter of MaxSymbolBytes.
	MaxInflateBytes int64
	// MaxKnownFiles bounds the files remembered from Open (id, paths, build
	// ids) that no Handle holds; default 4096.
	MaxKnownFiles int
	// MaxCachedAddrs bounds the (file, offset) → lines cache; default 16384.
	// Its bytes count in MaxSymbolBytes and are held to 1/addrCacheShare of
	// it.
	MaxCachedAddrs int
	// KallsymsPath is where Kernel reads symbols; default /proc/kallsyms.
	KallsymsPath string
	// DebugDirs are host directories searched for separate debug files
	// (<dir>/.build-id/xx/yyyy.debug, and <dir>/<file's dir>/<debuglink>),
	// after /usr/lib/debug inside the process's root for files opened
	// through /proc/PID/root or /proc/PID/map_files. Default
	// ["/usr/lib/debug"]; a non-nil empty slice searches no host directory.
	DebugDirs []string
}

const (
	defaultMaxFiles        = 256
	defaultMaxSymbolBytes  = 64 << 20
	defaultMaxDWARFBytes   = 32 << 20
	defaultMaxInflateBytes = 32 << 20
	defaultMaxKnownFiles   = 4096
	defaultMaxCachedAddrs  = 1 << 14
	defaultKallsymsPath    = "/proc/kallsyms"
)

func (o Options) withDefaults() Options {
	if o.MaxFiles <= 0 {
		o.MaxFiles = defaultMaxFiles
	}
	if o.MaxSymbolBytes <= 0 {
		o.MaxSymbolBytes = defaultMaxSymbolBytes
	}
	if o.MaxDWARFBytes <= 0 {
		o.MaxDWARFBytes = defaultMaxDWARFBytes
	}
	if o.MaxInflateBytes <= 0 {
		o.MaxInflateBytes = defaultMaxInflateBytes
	}
	o.MaxInflateBytes = min(o.MaxInflateBytes, max(o.MaxSymbolBytes/4, 1<<20))
	if o.MaxKnownFiles <= 0 {
		o.MaxKnownFiles = defaultMaxKnownFiles
	}
	if o.MaxCachedAddrs <= 0 {
		o.MaxCachedAddrs = defaultMaxCachedAddrs
	}
	if o.KallsymsPath == "" {
		o.KallsymsPath = defaultKallsymsPath
	}
	if o.DebugDirs == nil {
		o.DebugDirs = []string{elfx.DefaultDebugDir}
	}
	return o
}

// Stats are the Symbolizer's counters since New, and the current heap.
type Stats struct {
	FilesOpened       uint64 // Open calls that read and identified a file
	OpenHits          uint64 // Open calls answered from the identity cache
	FilesForgotten    uint64 // known files dropped by MaxKnownFiles
	IdentitiesDropped uint64 // (device, inode, size, mtime) entries dropped by MaxKnownFiles
	FilesLoaded       uint64 // symbol data loads (first Symbolize of a file, or after eviction)
	FilesEvicted      uint64 // symbol data dropped by MaxFiles or MaxSymbolBytes
	Lookups           uint64 // Symbolize calls
	Hits              uint64 // Symbolize calls answered from the (file, offset) cache
	Misses            uint64 // Symbolize calls that consulted symbol data
	Unnamed           uint64 // misses for which no symbol named the offset
	AddrsEvicted      uint64 // (file, offset) entries dropped by their bound
	Errors            uint64 // Open and Symbolize calls that returned an error
	InflateRefused    uint64 // compressed sections refused by MaxInflateBytes
	OpenFiles         int    // files held open by Handles now
	LoadedFiles       int    // files whose symbol data is loaded now
	// LoadedBytes is the memory symbolization holds now, all of it: loaded
	// files' indexes and inflated sections, the (file, offset) cache, the
	// kernel's symbols and the known files. It stays within MaxSymbolBytes except while a single
	// file larger than the rest of the budget is in use.
	LoadedBytes int64
}

// Symbolizer names frames. It is safe for concurrent use: lookups hold one
// mutex for cache bookkeeping only; symbol data is loaded outside it, once
// per file even when many goroutines ask at the same time.
type Symbolizer struct {
	logger *zap.Logger
	opts   Options
	kernel func() (*Kernel, error)

	mu          sync.Mutex
	identities  *lru[fileIdentity, *FileInfo] // bounded by MaxKnownFiles
	known       *lru[elfx.FileID, *knownFile] // unreferenced ones bounded by MaxKnownFiles
	openFiles   int                           // known files with refs > 0
	byInode     map[inodeKey]*knownFile       // known files held open, by their descriptor's device and inode
	knownBytes  int64
	loaded      *lru[elfx.FileID, *loadedFile]
	loadedBytes int64
	addrs       *lru[addrKey, []Line]
	addrBytes   int64
	kernelBytes int64
	kern        *Kernel // once loaded, for DropPages
	stats       Stats
	warned      bool // the inflation cap has been logged once
}

// inodeKey is a file's device and inode number, as /proc/PID/maps shows
// them. An inode cannot be reused while a descriptor holds it, so it
// identifies a file that is held open.
type inodeKey struct{ dev, ino uint64 }

// fileIdentity is what Open compares to recognise a file it has read.
type fileIdentity struct {
	dev, ino    uint64
	size, mtime int64
}

// knownFile is a file returned by Open. While refs > 0 it holds the file
// open by descriptor; symbol data is loaded through that descriptor, never
// through the path the file was opened by.
type knownFile struct {
	info *FileInfo
	size int64
	view elfx.View // where the file was first seen, for its debug file
	// host is the file's path on the host, when it was opened through the
	// root of a process that shares the host's root; a load after every
	// Handle is gone may use it (after checking the file id).
	host   string
	fd     *os.File // open while refs > 0
	inode  inodeKey // fd's device and inode
	refs   int
	noMini bool // its MiniDebugInfo was refused by the inflation cap once
}

// knownFileBytes estimates a knownFile's heap, with its FileInfo and the
// identity entry that points at it.
func knownFileBytes(k *knownFile) int64 {
	i := k.info
	return 400 + int64(len(i.Path)+len(i.Name)+len(i.GNUBuildID)+len(i.GoBuildID)+len(k.host)+len(k.view.Root)+len(k.view.Path))
}

// loadedFile is the symbol data of one file, loaded once.
type loadedFile struct {
	once    sync.Once
	syms    *fileSyms
	err     error
	done    bool  // once has run; guarded by Symbolizer.mu
	bytes   int64 // counted in loadedBytes while counted is true
	counted bool  // guarded by Symbolizer.mu
	users   int   // lookups reading syms now; guarded by Symbolizer.mu
	dropped bool  // evicted: unmap when users reaches 0; guarded by Symbolizer.mu
	reads   int   // lookups that read syms since its pages were last dropped; guarded by Symbolizer.mu
}

// addrCacheShare: the (file, offset) cache holds at most 1/addrCacheShare
// of MaxSymbolBytes, 2 MiB of the default. A hit saves 2-5 µs against a
// lookup in loaded symbol data (BenchmarkSymbolizeUncached), so only the
// hot addresses are worth keeping; at an eighth of the budget, the node-like
// host's compile loop filled it with addresses seen once, and the heap's
// goal grew by twice what it held.
const addrCacheShare = 32

// dropAfterReads is how many lookups may read a file's mappings before
// their pages are let go of. Each read maps the 64 KiB around it (the
// kernel's fault-around), and a lookup in a Go binary's pclntab reads five
// of its tables: after eight lookups the agent held 3 MB of its own
// pclntab at start-up. Dropping them costs the next lookups a few minor
// faults, and lookups that hit the address cache read nothing.
const dropAfterReads = 2

type addrKey struct {
	id  elfx.FileID
	off uint64
}

// addrEntryBytes estimates the heap of one (file, offset) cache entry.
func addrEntryBytes(lines []Line) int64 {
	n := int64(128 + int(unsafe.Sizeof(Line{}))*cap(lines))
	for _, l := range lines {
		n += int64(len(l.Function) + len(l.SystemName) + len(l.File))
	}
	return n
}

// New returns a Symbolizer. A nil logger logs nothing.
func New(logger *zap.Logger, opts Options) *Symbolizer {
	if logger == nil {
		logger = zap.NewNop()
	}
	opts = opts.withDefaults()
	s := &Symbolizer{
		logger:     logger,
		opts:       opts,
		identities: newLRU[fileIdentity, *FileInfo](),
		known:      newLRU[elfx.FileID, *knownFile](),
		loaded:     newLRU[elfx.FileID, *loadedFile](),
		addrs:      newLRU[addrKey, []Line](),
		byInode:    make(map[inodeKey]*knownFile),
	}
	s.kernel = sync.OnceValues(func() (*Kernel, error) {
		k, err := LoadKernel(opts.KallsymsPath)
		if err == nil {
			s.mu.Lock()
			s.kern = k
			s.kernelBytes = k.memSize()
			s.evictLoadedLocked(nil)
			s.mu.Unlock()
		}
		return k, err
	})
	return s
}

// Kernel returns the kernel symbol table, loaded once on first use from
// Options.KallsymsPath; a failure is remembered and returned on every call.
func (s *Symbolizer) Kernel() (*Kernel, error) { return s.kernel() }

// DropPages lets go of the pages of the loaded files' mappings that lookups
// have read (they stay in the page cache, shared with the processes that
// map the files): what the agent's RSS holds of them is then what lookups
// read since the last call. Only files read since then are touched, so
// calling it often costs little.
func (s *Symbolizer) DropPages() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.loaded.items {
		if lf := n.val; lf.done && lf.reads > 0 && !lf.dropped && lf.syms != nil {
			lf.syms.dropPages()
			lf.reads = 0
		}
	}
	if s.kern != nil && s.kern.touched.Swap(false) {
		s.kern.mem.DropPages()
	}
}

// InflateCap is what one file may inflate (Options.MaxInflateBytes after
// its defaults and bounds): the cap_bytes of the refusal's log line.
func (s *Symbolizer) InflateCap() int64 { return s.opts.MaxInflateBytes }

// Stats returns a snapshot of the counters.
func (s *Symbolizer) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.LoadedBytes = s.heapLocked()
	st.OpenFiles = s.openFiles
	st.LoadedFiles = s.loaded.len()
	return st
}

// heapLocked is all the heap the Symbolizer holds. s.mu is held.
func (s *Symbolizer) heapLocked() int64 {
	return s.loadedBytes + s.addrBytes + s.kernelBytes + s.knownBytes
}

// Open identifies the ELF file at path (normally /proc/PID/root/<mapped
// path>, or /proc/PID/map_files/<start>-<end>), keeps it open and returns a
// Handle to it. Paths under /proc/PID/root/ are resolved inside that root
// (elfx.OpenInRoot), so a container's symlinks cannot reach host files.
// A file already open (same device, inode, size, mtime, or the same
// content) is not read again: the Handle is another reference to it.
// Symbol data is loaded lazily on the first Symbolize for that file, not
// here. Release the Handle when no process needs the file any more.
func (s *Symbolizer) Open(path string) (*Handle, error) {
	h, err := s.open(path)
	if err != nil {
		s.mu.Lock()
		s.stats.Errors++
		s.mu.Unlock()
	}
	return h, err
}

func (s *Symbolizer) open(path string) (*Handle, error) {
	f, err := elfx.OpenFile(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		_ = f.Close()
		return nil, fmt.Errorf("open %s: not a regular file", path)
	}
	ident := identityOf(fi)

	s.mu.Lock()
	if info, ok := s.identities.get(ident); ok {
		if k, ok := s.known.get(info.ID); ok {
			s.stats.OpenHits++
			h, spare := s.refLocked(k, f)
			s.mu.Unlock()
			if spare != nil {
				_ = spare.Close()
			}
			return h, nil
		}
	}
	s.mu.Unlock()

	info, err := identify(f, fi.Size(), path)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	view := elfx.ViewOf(path)
	info.Name = view.Path
	host := hostPath(path)

	s.mu.Lock()
	s.stats.FilesOpened++
	k, ok := s.known.get(info.ID)
	if ok {
		// The same content under another inode (another container's copy).
		if k.host == "" {
			s.knownBytes += int64(len(host))
			k.host = host
		}
	} else {
		k = &knownFile{info: info, size: fi.Size(), view: view, host: host}
		s.known.put(info.ID, k)
		s.knownBytes += knownFileBytes(k)
	}
	s.identities.put(ident, k.info)
	h, spare := s.refLocked(k, f)
	s.trimKnownLocked()
	s.mu.Unlock()
	if spare != nil {
		_ = spare.Close()
	}
	return h, nil
}

// refLocked takes a reference to k, adopting f as its descriptor when k
// has none; it returns f when f is not needed (the caller closes it).
// s.mu is held.
func (s *Symbolizer) refLocked(k *knownFile, f *os.File) (*Handle, *os.File) {
	if k.refs == 0 {
		s.openFiles++
	}
	k.refs++
	spare := f
	if k.fd == nil && f != nil {
		k.fd, spare = f, nil
		if fi, err := f.Stat(); err == nil {
			id := identityOf(fi)
			k.inode = inodeKey{id.dev, id.ino}
			s.byInode[k.inode] = k
		}
		// A load that failed while the file was closed may work now.
		if lf, ok := s.loaded.peek(k.info.ID); ok && lf.done && lf.err != nil {
			s.dropLoadedLocked(k.info.ID, lf)
		}
	}
	return &Handle{FileInfo: k.info, s: s, k: k}, spare
}

// unrefLocked drops a reference to k and returns its descriptor when that
// was the last one (the caller closes it). s.mu is held.
func (s *Symbolizer) unrefLocked(k *knownFile) *os.File {
	k.refs--
	if k.refs > 0 {
		return nil
	}
	s.openFiles--
	fd := k.fd
	k.fd = nil
	if s.byInode[k.inode] == k {
		delete(s.byInode, k.inode)
	}
	s.trimKnownLocked()
	return fd
}

// trimKnownLocked forgets the least recently used known files that no
// Handle holds while more than MaxKnownFiles are known. s.mu is held.
func (s *Symbolizer) trimKnownLocked() {
	for n := s.known.len(); s.known.len()-s.openFiles > s.opts.MaxKnownFiles && n > 0; n-- {
		id, k, _ := s.known.removeOldest()
		if k.refs > 0 {
			s.known.put(id, k) // held open: stays, now as the newest
			continue
		}
		s.knownBytes -= knownFileBytes(k)
		s.stats.FilesForgotten++
	}
	for s.identities.len() > s.opts.MaxKnownFiles+s.openFiles {
		s.identities.removeOldest()
		s.stats.IdentitiesDropped++
	}
}

// hostPath returns the host path of a file opened as /proc/PID/root/<rest>
// when that process's root is the host's own, else "".
func hostPath(path string) string {
	root, rel, ok := elfx.SplitProcRoot(path)
	if !ok {
		return ""
	}
	var pr, hr unix.Stat_t
	if unix.Stat(root, &pr) != nil || unix.Stat("/", &hr) != nil || pr.Dev != hr.Dev || pr.Ino != hr.Ino {
		return ""
	}
	return rel
}

// identify reads a file's id and ELF identity.
func identify(f *os.File, size int64, path string) (*FileInfo, error) {
	id, err := elfx.ComputeFileID(f, size)
	if err != nil {
		return nil, fmt.Errorf("identify %s: %w", path, err)
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return nil, fmt.Errorf("identify %s: not a readable ELF file: %w", path, err)
	}
	info := &FileInfo{ID: id, Path: path, Size: size, IsGo: pclntabSection(ef) != nil}
	if info.GNUBuildID, err = elfx.GNUBuildID(ef); err != nil {
		return nil, fmt.Errorf("identify %s: %w", path, err)
	}
	if info.GoBuildID, err = elfx.GoBuildID(ef); err != nil {
		return nil, fmt.Errorf("identify %s: %w", path, err)
	}
	return info, nil
}

// Info returns the FileInfo of a file Open returned, while it is remembered
// (held by a Handle, or among the last MaxKnownFiles).
func (s *Symbolizer) Info(id elfx.FileID) (*FileInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.known.peek(id)
	if !ok {
		return nil, false
	}
	return k.info, true
}

// OpenMapped returns a Handle to the file a process maps from device dev,
// inode ino (as /proc/PID/maps shows them) without opening anything when a
// Handle already holds that file open; else it opens path as Open does. So
// the file of a process that has exited is still found while another
// Handle (of an earlier process, or of whoever prepared this one) holds it.
func (s *Symbolizer) OpenMapped(path string, dev, ino uint64) (*Handle, error) {
	if ino != 0 {
		s.mu.Lock()
		if k, ok := s.byInode[inodeKey{dev, ino}]; ok && k.refs > 0 {
			s.stats.OpenHits++
			s.known.get(k.info.ID)
			h, _ := s.refLocked(k, nil)
			s.mu.Unlock()
			return h, nil
		}
		s.mu.Unlock()
	}
	if path == "" {
		s.mu.Lock()
		s.stats.Errors++
		s.mu.Unlock()
		return nil, fmt.Errorf("open inode %d on device %#x: %w", ino, dev, ErrFileClosed)
	}
	return s.Open(path)
}

// Acquire returns another Handle to a file that a Handle holds open now;
// false when none does.
func (s *Symbolizer) Acquire(id elfx.FileID) (*Handle, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.known.peek(id)
	if !ok || k.refs == 0 {
		return nil, false
	}
	h, _ := s.refLocked(k, nil)
	return h, true
}

// Symbolize names the code at fileOffset of a file previously returned by
// Open; lines innermost first. A file without any symbols, or an offset no
// symbol covers, gives (nil, nil). The returned slice is shared with the
// cache and must not be modified. The file must be held open by a Handle
// unless its symbol data is still loaded (ErrFileClosed).
func (s *Symbolizer) Symbolize(id elfx.FileID, fileOffset uint64) ([]Line, error) {
	key := addrKey{id: id, off: fileOffset}
	s.mu.Lock()
	s.stats.Lookups++
	if lines, ok := s.addrs.get(key); ok {
		s.stats.Hits++
		s.mu.Unlock()
		return lines, nil
	}
	s.stats.Misses++
	k, ok := s.known.get(id)
	if !ok {
		s.stats.Errors++
		s.mu.Unlock()
		return nil, fmt.Errorf("symbolize %s: %w", id, ErrUnknownFile)
	}
	lf, ok := s.loaded.get(id)
	if !ok {
		if k.fd == nil && k.host == "" {
			s.stats.Errors++
			s.mu.Unlock()
			return nil, fmt.Errorf("symbolize %s: %w", id, ErrFileClosed)
		}
		lf = &loadedFile{}
		s.loaded.put(id, lf)
		s.evictLoadedLocked(lf)
	}
	lf.users++
	// Until it is loaded the file is pinned open, so the descriptor read
	// below stays valid while load uses it.
	var fd *os.File
	var pinned bool
	if !lf.done {
		pinned = true
		if k.refs == 0 {
			s.openFiles++
		}
		k.refs++
		fd = k.fd
	}
	host, noMini := k.host, k.noMini
	s.mu.Unlock()

	lf.once.Do(func() { s.load(lf, k, fd, host, noMini) })
	// lf.syms and lf.err are written once, inside once.Do, and read-only after.
	var lines []Line
	var size int64
	if lf.err == nil {
		lines = lf.syms.frames(fileOffset)
		size = lf.syms.memSize()
	}

	s.mu.Lock()
	var spare *os.File
	if pinned {
		spare = s.unrefLocked(k)
	}
	lf.users--
	if lf.reads++; lf.reads >= dropAfterReads && lf.syms != nil && !lf.dropped {
		lf.syms.dropPages()
		lf.reads = 0
	}
	if lf.dropped && lf.users == 0 && lf.syms != nil {
		lf.syms.unmap()
	}
	if lf.err != nil {
		s.stats.Errors++
		s.mu.Unlock()
		if spare != nil {
			_ = spare.Close()
		}
		return nil, lf.err
	}
	if lf.counted && size != lf.bytes {
		// Parsing a compile unit grows the file's index.
		s.loadedBytes += size - lf.bytes
		lf.bytes = size
	}
	if lines == nil {
		s.stats.Unnamed++
	}
	s.addrs.put(key, lines)
	s.addrBytes += addrEntryBytes(lines)
	for s.addrs.len() > s.opts.MaxCachedAddrs || (s.addrBytes > s.opts.MaxSymbolBytes/addrCacheShare && s.addrs.len() > 1) {
		_, old, _ := s.addrs.removeOldest()
		s.addrBytes -= addrEntryBytes(old)
		s.stats.AddrsEvicted++
	}
	s.evictLoadedLocked(lf)
	s.mu.Unlock()
	if spare != nil {
		_ = spare.Close()
	}
	return lines, nil
}

// load reads the symbol data of k through fd (its descriptor, nil when no
// Handle holds it) or else its host path, and accounts for its memory.
func (s *Symbolizer) load(lf *loadedFile, k *knownFile, fd *os.File, host string, noMini bool) {
	id := k.info.ID
	// One file's DWARF index may take half the budget (libc's debug file
	// takes 8 MB, its inflated sections): more would evict every other file.
	lim := loadLimits{maxDWARF: uint64(s.opts.MaxDWARFBytes), maxDWARFHeap: s.opts.MaxSymbolBytes / 2,
		inflate: s.opts.MaxInflateBytes, noMini: noMini}
	switch {
	case fd != nil:
		lf.syms, lf.err = s.loadFile(fd, k, lim)
	case host != "":
		f, err := os.Open(host)
		if err != nil {
			lf.err = err
			break
		}
		lf.syms, lf.err = s.loadFile(f, k, lim)
		_ = f.Close()
	default:
		lf.err = ErrFileClosed
	}
	if lf.err != nil {
		lf.err = fmt.Errorf("load symbols of %s: %w", id, lf.err)
		s.logger.Debug("cannot load symbols", zap.Stringer("file_id", id), zap.Error(lf.err))
	} else {
		lf.bytes = lf.syms.memSize()
		s.logger.Debug("loaded symbols", zap.Stringer("file_id", id), zap.String("file", k.info.Name),
			zap.String("sources", lf.syms.describe()), zap.Int64("bytes", lf.bytes))
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	lf.done = true
	s.stats.FilesLoaded++
	if lf.err == nil && lf.syms.refused != nil {
		s.stats.InflateRefused++
		k.noMini = true
		if !s.warned {
			s.warned = true
			s.logger.Warn("compressed symbol data refused: it would inflate past the per-file cap; the file is named without it (further refusals are only counted)",
				zap.String("file", k.info.Name), zap.Stringer("file_id", id), zap.Int64("cap_bytes", s.opts.MaxInflateBytes), zap.Error(lf.syms.refused))
		}
	}
	if cur, ok := s.loaded.peek(id); ok && cur == lf {
		lf.counted = true
		s.loadedBytes += lf.bytes
		s.evictLoadedLocked(lf)
	} else {
		lf.dropped = true // evicted while loading: unmapped by the last user
	}
}

// loadFile maps f, checks it still holds k's content, and loads it with its
// separate debug file, if one is found.
func (s *Symbolizer) loadFile(f *os.File, k *knownFile, lim loadLimits) (*fileSyms, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	if fi.Size() != k.size {
		return nil, fmt.Errorf("%s changed since it was opened", f.Name())
	}
	if got, err := elfx.ComputeFileID(f, k.size); err != nil || got != k.info.ID {
		return nil, errors.Join(fmt.Errorf("%s changed since it was opened", f.Name()), err)
	}
	img, err := elfx.MapImage(f, k.size)
	if err != nil {
		return nil, err
	}
	ef, err := elf.NewFile(bytes.NewReader(img.Bytes()))
	if err != nil {
		img.Unmap()
		return nil, fmt.Errorf("%s: %w", f.Name(), err)
	}
	var debug *elf.File
	var debugImg *elfx.Image
	df, err := elfx.FindDebugFile(ef, k.view, s.opts.DebugDirs)
	if err != nil {
		s.logger.Debug("debug file lookup", zap.String("file", k.info.Name), zap.Error(err))
	}
	if df != nil {
		if st, err := df.File().Stat(); err == nil {
			if debugImg, err = elfx.MapImage(df.File(), st.Size()); err == nil {
				debug, err = elf.NewFile(bytes.NewReader(debugImg.Bytes()))
				if err != nil {
					debugImg.Unmap()
					debug, debugImg = nil, nil
				}
			}
		}
		_ = df.Close()
		if debug != nil {
			s.logger.Debug("separate debug file", zap.String("file", k.info.Name), zap.String("debug_file", df.Path), zap.String("found_by", df.How))
		}
	}
	lim.dropRead = func(b []byte) {
		img.DropRange(b)
		debugImg.DropRange(b)
	}
	syms, err := loadSymsWith(ef, img.Bytes(), debug, debugImg.Bytes(), lim)
	if err != nil && debug != nil {
		// A broken debug file must not cost the names the file itself has.
		s.logger.Debug("unusable debug file", zap.String("debug_file", df.Path), zap.Error(err))
		debugImg.Unmap()
		debugImg = nil
		syms, err = loadSymsWith(ef, img.Bytes(), nil, nil, lim)
	}
	if err != nil {
		img.Unmap()
		debugImg.Unmap()
		return nil, fmt.Errorf("%s: %w", f.Name(), err)
	}
	syms.images = append(syms.images, img)
	if debugImg != nil {
		syms.images = append(syms.images, debugImg)
	}
	if syms.lines != nil {
		syms.lines.files = syms.images
	}
	// Indexing read the whole symbol table: lookups need few of its pages.
	syms.dropPages()
	return syms, nil
}

// dropLoadedLocked forgets a file's symbol data; its mappings go when the
// last lookup reading them is done. s.mu is held.
func (s *Symbolizer) dropLoadedLocked(id elfx.FileID, lf *loadedFile) {
	s.loaded.remove(id)
	if lf.counted {
		s.loadedBytes -= lf.bytes
		lf.counted = false
	}
	lf.dropped = true
	if lf.users == 0 && lf.syms != nil {
		lf.syms.unmap()
	}
}

// evictLoadedLocked drops the least recently used symbol data while over
// MaxFiles or the heap budget, never keep (nil: none kept). s.mu is held.
func (s *Symbolizer) evictLoadedLocked(keep *loadedFile) {
	for s.loaded.len() > s.opts.MaxFiles || (s.heapLocked() > s.opts.MaxSymbolBytes && s.loaded.len() > 1) {
		id, lf, _ := s.loaded.removeOldest()
		if lf == keep {
			s.loaded.put(id, lf) // the file being used stays, even alone over budget
			if s.loaded.len() == 1 {
				return
			}
			continue
		}
		s.loaded.put(id, lf)
		s.dropLoadedLocked(id, lf)
		s.stats.FilesEvicted++
	}
}
