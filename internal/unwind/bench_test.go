package unwind

import (
	"debug/elf"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/tracer"
)

const libcPath = "/lib/x86_64-linux-gnu/libc.so.6"

// BenchmarkFromELFLibc parses libc's CFI into a table.
func BenchmarkFromELFLibc(b *testing.B) {
	f, err := elf.Open(libcPath)
	if err != nil {
		b.Skip(err)
	}
	defer f.Close()
	var tab *Table
	b.ReportAllocs()
	for b.Loop() {
		if tab, err = FromELF(f); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(tab.Rows)), "rows")
}

// BenchmarkBuildLibc builds libc's kernel table as the Loader does when a
// process first maps it: open, parse, look for a debug file, convert to
// kernel rows.
func BenchmarkBuildLibc(b *testing.B) {
	if _, err := os.Stat(libcPath); err != nil {
		b.Skip(err)
	}
	var n int
	b.ReportAllocs()
	for b.Loop() {
		lf, rows, mem := buildFile(libcPath, []string{elfx.DefaultDebugDir}, zap.NewNop())
		if lf.err != nil {
			b.Fatal(lf.err)
		}
		n = len(rows)
		mem.run()
	}
	b.ReportMetric(float64(n), "rows")
	b.ReportMetric(float64(tableBytes(n)), "kernel-bytes") // rows only: the page index adds a few per cent
}

// BenchmarkHostTables builds the tables the Loader would load (without
// loading them) for every executable file that a process on this machine
// maps, each file once however many processes map it, and reports what
// they come to: processes, files, tables built, files without CFI or
// that failed, rows, the kernel memory the Loader would count, and the
// time to build them all.
func BenchmarkHostTables(b *testing.B) {
	testutil.RequirePrivileges(b, "reading every process's files")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	procs := process.NewTable("/proc", nil, process.Options{})
	paths := map[elfx.FileID]string{}
	nprocs := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p, err := procs.Get(pid)
		if err != nil {
			continue // gone, or a kernel thread
		}
		mapped := false
		for _, m := range p.Mappings {
			path := p.FilePath(m)
			if !m.Executable() || path == "" {
				continue
			}
			id, err := identifyFile(path)
			if err != nil {
				continue
			}
			mapped = true
			if _, ok := paths[id]; !ok {
				paths[id] = path
			}
		}
		if mapped {
			nprocs++
		}
	}
	if len(paths) == 0 {
		b.Fatal("no executable file mapped by any process")
	}
	log := zap.NewNop()
	debugDirs := []string{elfx.DefaultDebugDir}
	// for range b.N, not b.Loop: with b.Loop this body crashes the go1.26.8
	// compiler (internal compiler error in iter.go).
	for range b.N {
		var tables, noCFI, failed, debug, rows int
		var bytes int64
		largestPath, largestRows := "", 0
		start := time.Now()
		for _, path := range paths {
			lf, kr, mem := buildFile(path, debugDirs, log)
			mem.run() // only its length is read below
			switch {
			case lf.err == nil:
				tables++
				rows += len(kr)
				bytes += tableBytes(tracer.TableEntries(kr))
				if len(kr) > largestRows {
					largestPath, largestRows = path, len(kr)
				}
			case errors.Is(lf.err, ErrNoCFI):
				noCFI++
			default:
				failed++
				b.Logf("%s: %v", path, lf.err)
			}
			if lf.debug != "" {
				debug++
			}
		}
		elapsed := time.Since(start)
		b.ReportMetric(float64(nprocs), "processes")
		b.ReportMetric(float64(len(paths)), "files")
		b.ReportMetric(float64(tables), "tables")
		b.ReportMetric(float64(noCFI), "nocfi-files")
		b.ReportMetric(float64(failed), "failed-files")
		b.ReportMetric(float64(debug), "debug-files")
		b.ReportMetric(float64(rows), "rows")
		b.ReportMetric(float64(bytes), "kernel-bytes")
		b.ReportMetric(float64(elapsed.Microseconds())/1000, "build-ms")
		b.Logf("largest table: %s, %d rows", largestPath, largestRows)
	}
}
