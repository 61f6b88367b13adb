package symbolize

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"sync"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/elfx"
)

// ErrUnknownFile is returned by Symbolize for a file id that Open never
// returned, or that has since been dropped from the bounded set of known
// files (Options.MaxKnownFiles); Open the file again.
var ErrUnknownFile = errors.New("unknown file id")

// Frame is one named source position. Several frames for one address are
// inline levels, innermost first.
type Frame struct {
	Function   string // display name (demangled)
	SystemName string // raw symbol name as in the binary (mangled), "" if same as Function
	File       string
	Line       int64
	// Go: named by the Go pclntab, so Go code. In a cgo binary (IsGo) the
	// C half is named from ELF symbols and DWARF and is not Go.
	Go bool
}

// FileInfo identifies an ELF file. It is shared by every caller that opens
// the same file and must not be modified.
type FileInfo struct {
	ID         elfx.FileID
	Path       string // the path it was opened by
	GNUBuildID string
	GoBuildID  string
	IsGo       bool // has a .gopclntab: Go code (and, with cgo, C code: see Frame.Go)
}

// Options bounds the Symbolizer's memory. Zero fields take the defaults.
type Options struct {
	MaxFiles int // how many files' symbol data stay loaded (LRU); default 256
	// MaxSymbolBytes bounds the estimated heap of loaded symbol data; the
	// least recently used files are dropped past it. Default 64 MiB.
	MaxSymbolBytes int64
	// MaxDWARFBytes is the largest total of .debug_* sections indexed for
	// line numbers in one file; bigger files are named from symbols only.
	// Default 32 MiB.
	MaxDWARFBytes int64
	// MaxKnownFiles bounds the files remembered from Open (id, paths, build
	// ids); default 4096.
	MaxKnownFiles int
	// MaxCachedAddrs bounds the (file, offset) → frames cache; default 65536.
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
	defaultMaxFiles       = 256
	defaultMaxSymbolBytes = 64 << 20
	defaultMaxDWARFBytes  = 32 << 20
	defaultMaxKnownFiles  = 4096
	defaultMaxCachedAddrs = 1 << 16
	defaultKallsymsPath   = "/proc/kallsyms"

	// maxPathsPerFile bounds the paths remembered for one file id; symbol
	// data is loaded through the most recent one that still opens.
	maxPathsPerFile = 4
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

// Stats are the Symbolizer's counters since New, and the current estimate
// of loaded symbol data.
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
	AddrsEvicted      uint64 // (file, offset) entries dropped by MaxCachedAddrs
	Errors            uint64 // Open and Symbolize calls that returned an error
	LoadedBytes       int64  // estimated heap of the symbol data loaded now
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
	known       *lru[elfx.FileID, *knownFile] // bounded by MaxKnownFiles
	loaded      *lru[elfx.FileID, *loadedFile]
	loadedBytes int64
	addrs       *lru[addrKey, []Frame]
	stats       Stats
}

// fileIdentity is what Open compares to recognise a file it has read.
type fileIdentity struct {
	dev, ino    uint64
	size, mtime int64
}

// knownFile is a file returned by Open, with the paths it was opened by.
type knownFile struct {
	info  *FileInfo
	size  int64
	paths []string // most recent last
	// host is the file's path on the host, when it was opened through the
	// root of a process that shares the host's root: it outlives every
	// process that maps the file (short-lived ones are gone before their
	// frames are named). Tried last.
	host string
}

// loadedFile is the symbol data of one file, loaded once.
type loadedFile struct {
	once    sync.Once
	syms    *fileSyms
	err     error
	bytes   int64 // counted in loadedBytes while counted is true
	counted bool  // guarded by Symbolizer.mu
}

type addrKey struct {
	id  elfx.FileID
	off uint64
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
		addrs:      newLRU[addrKey, []Frame](),
	}
	s.kernel = sync.OnceValues(func() (*Kernel, error) { return LoadKernel(opts.KallsymsPath) })
	return s
}

// Kernel returns the kernel symbol table, loaded once on first use from
// Options.KallsymsPath; a failure is remembered and returned on every call.
func (s *Symbolizer) Kernel() (*Kernel, error) { return s.kernel() }

// Stats returns a snapshot of the counters.
func (s *Symbolizer) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.LoadedBytes = s.loadedBytes
	return st
}

// Open identifies the ELF file at path (normally /proc/PID/root/<mapped
// path>, or /proc/PID/map_files/<start>-<end>) and returns its FileInfo.
// Paths under /proc/PID/root/ are resolved inside that root
// (elfx.OpenInRoot), so a container's symlinks cannot reach host files.
// Repeated calls for the same file (same device, inode, size, mtime) are
// answered from a cache without reading the file again. Symbol data is
// loaded lazily on the first Symbolize for that file, not here.
func (s *Symbolizer) Open(path string) (*FileInfo, error) {
	info, err := s.open(path)
	if err != nil {
		s.mu.Lock()
		s.stats.Errors++
		s.mu.Unlock()
	}
	return info, err
}

func (s *Symbolizer) open(path string) (*FileInfo, error) {
	f, err := elfx.OpenFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("open %s: not a regular file", path)
	}
	ident := identityOf(fi)

	s.mu.Lock()
	if info, ok := s.identities.get(ident); ok {
		if k, ok := s.known.get(info.ID); ok {
			s.stats.OpenHits++
			k.addPath(path)
			s.mu.Unlock()
			return info, nil
		}
	}
	s.mu.Unlock()

	info, err := identify(f, fi.Size(), path)
	if err != nil {
		return nil, err
	}

	host := hostPath(path)

	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.FilesOpened++
	if k, ok := s.known.get(info.ID); ok {
		// The same content under another inode (another container's copy).
		k.addPath(path)
		if k.host == "" {
			k.host = host
		}
		info = k.info
	} else {
		s.known.put(info.ID, &knownFile{info: info, size: fi.Size(), paths: []string{path}, host: host})
	}
	s.identities.put(ident, info)
	for s.known.len() > s.opts.MaxKnownFiles {
		s.known.removeOldest()
		s.stats.FilesForgotten++
	}
	for s.identities.len() > s.opts.MaxKnownFiles {
		s.identities.removeOldest()
		s.stats.IdentitiesDropped++
	}
	return info, nil
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

// addPath remembers path as the most recent way to open the file.
func (k *knownFile) addPath(path string) {
	for i, p := range k.paths {
		if p == path {
			k.paths = append(k.paths[:i], k.paths[i+1:]...)
			break
		}
	}
	if len(k.paths) >= maxPathsPerFile {
		k.paths = k.paths[1:]
	}
	k.paths = append(k.paths, path)
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
	info := &FileInfo{ID: id, Path: path, IsGo: pclntabSection(ef) != nil}
	if info.GNUBuildID, err = elfx.GNUBuildID(ef); err != nil {
		return nil, fmt.Errorf("identify %s: %w", path, err)
	}
	if info.GoBuildID, err = elfx.GoBuildID(ef); err != nil {
		return nil, fmt.Errorf("identify %s: %w", path, err)
	}
	return info, nil
}

// Info returns the FileInfo of a file Open returned, while it is remembered
// (Options.MaxKnownFiles).
func (s *Symbolizer) Info(id elfx.FileID) (*FileInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.known.peek(id)
	if !ok {
		return nil, false
	}
	return k.info, true
}

// Symbolize names the code at fileOffset of a file previously returned by
// Open; frames innermost first. A file without any symbols, or an offset no
// symbol covers, gives (nil, nil). The returned slice is shared with the
// cache and must not be modified.
func (s *Symbolizer) Symbolize(id elfx.FileID, fileOffset uint64) ([]Frame, error) {
	key := addrKey{id: id, off: fileOffset}
	s.mu.Lock()
	s.stats.Lookups++
	if frames, ok := s.addrs.get(key); ok {
		s.stats.Hits++
		s.mu.Unlock()
		return frames, nil
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
		lf = &loadedFile{}
		s.loaded.put(id, lf)
		s.evictLoadedLocked(lf)
	}
	paths := append([]string(nil), k.paths...)
	if k.host != "" {
		paths = append([]string{k.host}, paths...) // tried last
	}
	size := k.size
	s.mu.Unlock()

	lf.once.Do(func() { s.load(lf, id, size, paths) })
	// lf.syms and lf.err are written once, inside once.Do, and read-only after.
	var frames []Frame
	if lf.err == nil {
		frames = lf.syms.frames(fileOffset)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if lf.err != nil {
		s.stats.Errors++
		return nil, lf.err
	}
	if frames == nil {
		s.stats.Unnamed++
	}
	s.addrs.put(key, frames)
	for s.addrs.len() > s.opts.MaxCachedAddrs {
		s.addrs.removeOldest()
		s.stats.AddrsEvicted++
	}
	return frames, nil
}

// load reads the symbol data of a file through the most recent of its paths
// that still opens to the same content, and accounts for its memory.
func (s *Symbolizer) load(lf *loadedFile, id elfx.FileID, size int64, paths []string) {
	var errs []error
	for i := len(paths) - 1; i >= 0 && lf.syms == nil; i-- {
		syms, err := s.loadPath(id, size, paths[i])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		lf.syms = syms
	}
	if lf.syms == nil {
		lf.err = fmt.Errorf("load symbols of %s: %w", id, errors.Join(errs...))
		s.logger.Debug("cannot load symbols", zap.Stringer("file_id", id), zap.Error(lf.err))
	} else {
		lf.bytes = lf.syms.memSize()
		s.logger.Debug("loaded symbols", zap.Stringer("file_id", id), zap.String("path", paths[len(paths)-1]),
			zap.String("sources", lf.syms.describe()), zap.Int64("bytes", lf.bytes))
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.FilesLoaded++
	if cur, ok := s.loaded.peek(id); ok && cur == lf {
		lf.counted = true
		s.loadedBytes += lf.bytes
		s.evictLoadedLocked(lf)
	}
}

// loadPath opens path, checks it still holds the file id, and loads it.
func (s *Symbolizer) loadPath(id elfx.FileID, size int64, path string) (*fileSyms, error) {
	f, err := elfx.OpenFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if fi.Size() != size {
		return nil, fmt.Errorf("%s changed since it was opened", path)
	}
	if got, err := elfx.ComputeFileID(f, size); err != nil || got != id {
		return nil, errors.Join(fmt.Errorf("%s changed since it was opened", path), err)
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var debug *elf.File
	df, err := elfx.FindDebugFile(ef, elfx.ViewOf(path), s.opts.DebugDirs)
	if err != nil {
		s.logger.Debug("debug file lookup", zap.String("path", path), zap.Error(err))
	}
	if df != nil {
		defer df.Close()
		debug = df.ELF
		s.logger.Debug("separate debug file", zap.String("path", path), zap.String("debug_file", df.Path), zap.String("found_by", df.How))
	}
	syms, err := loadSymsWith(ef, debug, uint64(s.opts.MaxDWARFBytes))
	if err != nil && debug != nil {
		// A broken debug file must not cost the names the file itself has.
		s.logger.Debug("unusable debug file", zap.String("debug_file", df.Path), zap.Error(err))
		syms, err = loadSyms(ef, uint64(s.opts.MaxDWARFBytes))
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return syms, nil
}

// evictLoadedLocked drops the least recently used symbol data while over
// MaxFiles or MaxSymbolBytes, never keep. s.mu is held.
func (s *Symbolizer) evictLoadedLocked(keep *loadedFile) {
	for s.loaded.len() > s.opts.MaxFiles || (s.loadedBytes > s.opts.MaxSymbolBytes && s.loaded.len() > 1) {
		id, lf, _ := s.loaded.removeOldest()
		if lf == keep {
			s.loaded.put(id, lf) // the file being used stays, even alone over budget
			continue
		}
		if lf.counted {
			s.loadedBytes -= lf.bytes
			lf.counted = false
		}
		s.stats.FilesEvicted++
	}
}
