package symbolize

import (
	"runtime"
	"testing"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// BenchmarkSymbolizeHost names code in every executable mapping of every
// process on this machine (64 addresses spread over each mapping), as
// profiling the whole host does over time, and reports what the caches then
// hold: files, loads, the heap the Symbolizer accounts for, the heap in use
// and the resident memory the mappings add (file pages, not heap).
func BenchmarkSymbolizeHost(b *testing.B) {
	testutil.RequirePrivileges(b, "reading every process's files")
	procs := process.NewTable("/proc", nil, process.Options{})
	if err := procs.Scan(); err != nil {
		b.Fatal(err)
	}
	var pids []int
	for pid := 1; pid < 1<<22 && len(pids) < procs.Len(); pid++ {
		if _, err := procs.Get(pid); err == nil {
			pids = append(pids, pid)
		}
	}
	b.ResetTimer()
	for range b.N {
		s := New(nil, Options{MaxSymbolBytes: 32 << 20})
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		lookups := 0
		var handles []*Handle
		for _, pid := range pids {
			p, err := procs.Get(pid)
			if err != nil {
				continue
			}
			for _, m := range p.Mappings {
				path := p.FilePath(m)
				if !m.Executable() || path == "" {
					continue
				}
				h, err := s.OpenMapped(path, m.Dev, m.Inode)
				if err != nil {
					continue
				}
				handles = append(handles, h)
				for i := range uint64(64) {
					_, _ = s.Symbolize(h.ID, m.Offset+(m.End-m.Start)*i/64)
					lookups++
				}
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		st := s.Stats()
		b.ReportMetric(float64(len(pids)), "processes")
		b.ReportMetric(float64(st.FilesLoaded), "loads")
		b.ReportMetric(float64(st.OpenFiles), "files")
		b.ReportMetric(float64(lookups), "lookups")
		b.ReportMetric(float64(st.LoadedBytes)/(1<<20), "symbol-data-MiB")
		b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse))/(1<<20), "heap-MiB")
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), "heap-alloc-MiB")
		for _, h := range handles {
			h.Release()
		}
		runtime.KeepAlive(s)
	}
}
