package pprofexporter

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"
)

// File names: profile-<UTC time>-<sequence>[-<split key>].pb.gz, and the same
// name with .folded for folded stacks. The time and sequence make names sort
// in the order they were written.
const (
	filePrefix   = "profile-"
	pprofSuffix  = ".pb.gz"
	foldedSuffix = ".folded"
	tempPrefix   = ".tmp-profile-"
	timeLayout   = "20060102T150405.000Z"
	maxKeyLength = 64
)

// pprofExporter writes exports into cfg.Directory. Its methods are safe for
// concurrent use: a mutex serializes writing and rotation so the sequence
// numbers and the directory listing stay consistent.
type pprofExporter struct {
	cfg    *Config
	logger *zap.Logger
	now    func() time.Time

	mu  sync.Mutex
	seq uint64
}

func newExporter(cfg *Config, logger *zap.Logger, now func() time.Time) *pprofExporter {
	return &pprofExporter{cfg: cfg, logger: logger, now: now}
}

func (e *pprofExporter) start(context.Context, component.Host) error {
	if err := os.MkdirAll(e.cfg.Directory, e.cfg.FileMode.dirMode()); err != nil {
		return fmt.Errorf("pprof exporter: directory: %w", err)
	}
	return nil
}

// consumeProfiles writes one file (and its folded twin) per group of pd. A
// write error is returned, after the other groups were tried, so the
// pipeline counts the export as failed.
func (e *pprofExporter) consumeProfiles(_ context.Context, pd pprofile.Profiles) error {
	if e.cfg.LogStacks > 0 {
		if tables := heaviestStacks(pd); len(tables) > 0 {
			e.logger.Info("heaviest stacks, leaf first\n" + formatStacks(tables, e.cfg.LogStacks))
		}
	}
	groups, invalid := convert(pd, e.cfg.SplitBy)
	if invalid > 0 {
		e.logger.Warn("pprof exporter skipped references out of range of the profiles dictionary", zap.Int("count", invalid))
	}
	if len(groups) == 0 {
		return nil
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq++
	now := e.now()
	base := fmt.Sprintf("%s%s-%06d", filePrefix, now.UTC().Format(timeLayout), e.seq)
	var errs []error
	var written []string
	for _, g := range groups {
		name := base
		if g.key != "" {
			name += "-" + sanitizeKey(g.key)
		}
		var buf bytes.Buffer
		if err := g.prof.Write(&buf); err != nil {
			errs = append(errs, fmt.Errorf("encode %s: %w", name, err))
			continue
		}
		if err := writeAtomic(e.cfg.Directory, e.cfg.FileMode, name+pprofSuffix, buf.Bytes()); err != nil {
			errs = append(errs, err)
			continue
		}
		written = append(written, name+pprofSuffix)
		if e.cfg.Folded {
			buf.Reset()
			if err := writeFolded(&buf, g.prof); err != nil {
				errs = append(errs, fmt.Errorf("folded %s: %w", name, err))
				continue
			}
			if err := writeAtomic(e.cfg.Directory, e.cfg.FileMode, name+foldedSuffix, buf.Bytes()); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := e.rotate(now); err != nil {
		// Old files left behind lose no data: log, do not fail the export.
		e.logger.Warn("pprof exporter could not remove old profiles", zap.Error(err))
	}
	if e.cfg.LogTop > 0 {
		e.logger.Info("profiles written to "+e.cfg.Directory+"\n"+formatTop(topFunctions(groups), e.cfg.LogTop),
			zap.Strings("files", written))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("pprof exporter: %w", err)
	}
	return nil
}

// sanitizeKey makes a split key safe as part of a file name: letters,
// digits, '.', '_' and '-' are kept, every other byte becomes '_', and the
// result is at most maxKeyLength bytes.
func sanitizeKey(key string) string {
	b := []byte(key)
	if len(b) > maxKeyLength {
		b = b[:maxKeyLength]
	}
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			b[i] = '_'
		}
	}
	return string(b)
}

// writeAtomic writes data to dir/name through a temporary file in dir and a
// rename, so readers see the whole file or none of it. The file is created
// with mode, so the kernel applies the process's umask as for any new file.
func writeAtomic(dir string, mode FileMode, name string, data []byte) (err error) {
	if err := os.MkdirAll(dir, mode.dirMode()); err != nil {
		return fmt.Errorf("directory: %w", err)
	}
	f, err := createTemp(dir, fs.FileMode(mode))
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := os.Rename(f.Name(), filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// createTemp is os.CreateTemp with a mode: os.CreateTemp always asks for
// 0600, and a chmod afterwards would ignore the umask.
func createTemp(dir string, mode fs.FileMode) (*os.File, error) {
	for range 100 {
		path := filepath.Join(dir, tempPrefix+strconv.FormatUint(rand.Uint64(), 36))
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, err
	}
	return nil, fmt.Errorf("temporary file in %s: %w", dir, fs.ErrExist)
}

// rotate removes the oldest profiles beyond max_files and those older than
// max_age. A profile is a base name with its .pb.gz and .folded files; its
// age is that of its newest file. Files of other names are never touched.
func (e *pprofExporter) rotate(now time.Time) error {
	if e.cfg.MaxFiles == 0 && e.cfg.MaxAge == 0 {
		return nil
	}
	entries, err := os.ReadDir(e.cfg.Directory)
	if err != nil {
		return fmt.Errorf("list %s: %w", e.cfg.Directory, err)
	}
	type stored struct {
		base  string
		mtime time.Time
		files []string
	}
	byBase := map[string]*stored{}
	var all []*stored
	var errs []error
	for _, ent := range entries {
		name := ent.Name()
		base, ok := profileBase(name)
		if !ok || !ent.Type().IsRegular() {
			continue
		}
		info, err := ent.Info()
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		s := byBase[base]
		if s == nil {
			s = &stored{base: base}
			byBase[base] = s
			all = append(all, s)
		}
		s.files = append(s.files, name)
		if info.ModTime().After(s.mtime) {
			s.mtime = info.ModTime()
		}
	}
	// Newest first; the name breaks ties (it sorts by time and sequence).
	slices.SortFunc(all, func(a, b *stored) int {
		return cmp.Or(b.mtime.Compare(a.mtime), strings.Compare(b.base, a.base))
	})
	for i, s := range all {
		tooMany := e.cfg.MaxFiles > 0 && i >= e.cfg.MaxFiles
		tooOld := e.cfg.MaxAge > 0 && now.Sub(s.mtime) > e.cfg.MaxAge
		if !tooMany && !tooOld {
			continue
		}
		for _, f := range s.files {
			if err := os.Remove(filepath.Join(e.cfg.Directory, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// profileBase returns the base name of a file this exporter writes.
func profileBase(name string) (string, bool) {
	if !strings.HasPrefix(name, filePrefix) {
		return "", false
	}
	for _, suffix := range []string{pprofSuffix, foldedSuffix} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			return base, true
		}
	}
	return "", false
}
