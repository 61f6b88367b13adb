package pprofexporter

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/sonde-dev/sonde/internal/profile"
)

func TestLogStacks(t *testing.T) {
	samples := fixture()
	// Oracle: distinct (process, thread, CPU, stack) per kind, and totals.
	type key struct {
		kind          profile.Kind
		pid, tid, cpu int64
		stack         string
	}
	count := map[key]int64{}
	distinct := map[profile.Kind]int{}
	total := map[profile.Kind]int64{}
	for _, s := range samples {
		k := key{s.Kind, s.Resource.PID, s.TID, s.CPU, fmt.Sprint(s.Frames)}
		if count[k] == 0 {
			distinct[s.Kind]++
		}
		v := s.Value
		if s.Kind == profile.OnCPU {
			v = 1
		}
		count[k] += v
		total[s.Kind] += v
	}
	var heaviest int64
	for k, n := range count {
		if k.kind == profile.OnCPU {
			heaviest = max(heaviest, n)
		}
	}

	for _, n := range []int{1, 2, 100} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			e, logs := newTestExporter(t, func(c *Config) { c.LogStacks = n })
			if err := e.consumeProfiles(t.Context(), build(samples)); err != nil {
				t.Fatal(err)
			}
			entries := logs.FilterMessageSnippet("heaviest stacks").All()
			if len(entries) != 1 {
				t.Fatalf("got %d stack log entries, want 1; all: %v", len(entries), logs.All())
			}
			msg := entries[0].Message
			onShown := min(n, distinct[profile.OnCPU])
			offShown := min(n, distinct[profile.OffCPU])
			for _, want := range []string{
				fmt.Sprintf("heaviest %d of %d stacks, %d samples (count) in all", onShown, distinct[profile.OnCPU], total[profile.OnCPU]),
				fmt.Sprintf("heaviest %d of %d stacks, %d off_cpu (nanoseconds) in all", offShown, distinct[profile.OffCPU], total[profile.OffCPU]),
				fmt.Sprintf("#1 %d samples (%.1f%%)", heaviest, 100*float64(heaviest)/float64(total[profile.OnCPU])),
			} {
				if !strings.Contains(msg, want) {
					t.Errorf("stacks lack %q:\n%s", want, msg)
				}
			}
			if got := len(regexp.MustCompile(`(?m)^#\d+ `).FindAllString(msg, -1)); got != onShown+offShown {
				t.Errorf("printed %d stacks, want %d:\n%s", got, onShown+offShown, msg)
			}
			if n < 2 {
				return
			}
			// The two heaviest on-CPU stacks tie; billing sorts first. Each
			// block: resource, sample attributes, frames leaf first with
			// inline functions innermost first.
			for _, want := range []string{
				"\n  resource: service.name=billing/v2 (eu) process.executable.name=billing process.pid=200" +
					"\n  sample:   thread.id=201 thread.name=billing cpu.logical_number=1" +
					"\n    go       main.compute  /src/billing/main.go:21" +
					"\n    go       main.main  /src/billing/main.go:9\n#2 ",
				"\n  resource: service.name=checkout process.executable.name=app process.pid=100" +
					"\n  sample:   thread.id=101 thread.name=worker cpu.logical_number=0" +
					"\n    native   hash_byte  /src/hash.c:12" +
					"\n    native   hash  /src/hash.c:40" +
					"\n    native   main  /src/main.c:7\n",
			} {
				if !strings.Contains(msg, want) {
					t.Errorf("stacks lack block %q:\n%s", want, msg)
				}
			}
			if n < 100 {
				return
			}
			for _, want := range []string{
				"\n    kernel   do_syscall_64  0xffffffff81000010\n    native   [libc.so.6]  0x7f0000012345\n    native   main  /src/main.c:7",
			} {
				if !strings.Contains(msg, want) {
					t.Errorf("stacks lack %q:\n%s", want, msg)
				}
			}
		})
	}

	t.Run("off", func(t *testing.T) {
		e, logs := newTestExporter(t, nil)
		if err := e.consumeProfiles(t.Context(), build(samples)); err != nil {
			t.Fatal(err)
		}
		if n := logs.FilterMessageSnippet("heaviest").Len(); n != 0 {
			t.Errorf("log_stacks 0 logged %d blocks, want 0", n)
		}
	})
}
