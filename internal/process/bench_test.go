package process

import (
	"os"
	"testing"
	"time"
)

// BenchmarkGetCached is the per-sample path: a known pid.
func BenchmarkGetCached(b *testing.B) {
	tab := NewTable("", nil, Options{})
	pid := os.Getpid()
	if _, err := tab.Get(pid); err != nil {
		b.Skipf("Get(self): %v", err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := tab.Get(pid); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRefresh re-reads the mappings of this process each time.
func BenchmarkRefresh(b *testing.B) {
	tab := NewTable("", nil, Options{RefreshInterval: time.Nanosecond})
	pid := os.Getpid()
	if _, err := tab.Get(pid); err != nil {
		b.Skipf("Get(self): %v", err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tab.Refresh(pid); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRefreshLimited is a storm of unknown addresses from one pid.
func BenchmarkRefreshLimited(b *testing.B) {
	tab := NewTable("", nil, Options{RefreshInterval: time.Hour})
	pid := os.Getpid()
	if _, err := tab.Refresh(pid); err != nil {
		b.Skipf("Refresh(self): %v", err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tab.Refresh(pid); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoad reads this process from scratch (after an exec).
func BenchmarkLoad(b *testing.B) {
	tab := NewTable("", nil, Options{})
	pid := os.Getpid()
	b.ReportAllocs()
	for b.Loop() {
		tab.Exec(pid)
		if _, err := tab.Get(pid); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScan reads every process of the host into an empty table, the
// start-up cost.
func BenchmarkScan(b *testing.B) {
	b.ReportAllocs()
	var n int
	for b.Loop() {
		tab := NewTable("", nil, Options{})
		if err := tab.Scan(); err != nil {
			b.Fatal(err)
		}
		n = tab.Len()
	}
	b.ReportMetric(float64(n), "processes")
}
