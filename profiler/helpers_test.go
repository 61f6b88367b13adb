package profiler

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// sink keeps every interval a running profiler emits.
type sink struct {
	mu  sync.Mutex
	got []pprofile.Profiles
}

func (s *sink) emit(_ context.Context, pd pprofile.Profiles) error {
	s.mu.Lock()
	s.got = append(s.got, pd)
	s.mu.Unlock()
	return nil
}

// all returns the intervals emitted so far.
func (s *sink) all() []pprofile.Profiles {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]pprofile.Profiles(nil), s.got...)
}

// waitFor waits until the sink holds n intervals or limit passes.
func (s *sink) waitFor(n int, limit time.Duration) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	end := time.After(limit)
	for len(s.all()) < n {
		select {
		case <-tick.C:
		case <-end:
			return
		}
	}
}

// startProfiler runs a real profiler at sps Hz with 500 ms intervals until
// the test ends; edit, when given, changes the options first.
func startProfiler(t *testing.T, sps int, edit ...func(*Options)) (*Profiler, *sink) {
	t.Helper()
	p, s, _ := runProfiler(t, sps, edit...)
	return p, s
}

// runProfiler is startProfiler that also returns stop, which ends Run and
// returns its error; the test's end calls it if the test did not.
func runProfiler(t *testing.T, sps int, edit ...func(*Options)) (*Profiler, *sink, func() error) {
	t.Helper()
	testutil.RequirePrivileges(t, "the sonde profiler")
	opts := DefaultOptions()
	opts.SamplesPerSecond = sps
	opts.ReporterInterval = 500 * time.Millisecond
	opts.Logger = zaptest.NewLogger(t)
	for _, e := range edit {
		e(&opts)
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	s := new(sink)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, s.emit) }()
	stop := sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p, s, stop
}

// pidsOf returns the process.pid of every resource of pd that holds samples.
func pidsOf(pd pprofile.Profiles) map[int64]bool {
	pids := map[int64]bool{}
	for _, rp := range pd.ResourceProfiles().All() {
		pid, _ := rp.Resource().Attributes().Get("process.pid")
		for _, sp := range rp.ScopeProfiles().All() {
			for _, prof := range sp.Profiles().All() {
				if prof.Samples().Len() > 0 {
					pids[pid.Int()] = true
				}
			}
		}
	}
	return pids
}

// testFrame is a frame as the output shows it: its function's name, its
// profile.frame.type, its mapping's file name and its address.
type testFrame struct {
	name, typ, mapping string
	addr               uint64
}

// stacksOf returns the stacks (leaf first) of pid's samples in pd, each
// repeated by its sample count.
func stacksOf(pd pprofile.Profiles, pid int) [][]testFrame {
	dict := pd.Dictionary()
	strs := dict.StringTable()
	var out [][]testFrame
	for _, rp := range pd.ResourceProfiles().All() {
		if v, ok := rp.Resource().Attributes().Get("process.pid"); !ok || v.Int() != int64(pid) {
			continue
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, prof := range sp.Profiles().All() {
				for _, s := range prof.Samples().All() {
					var st []testFrame
					for _, li := range dict.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
						loc := dict.LocationTable().At(int(li))
						f := testFrame{addr: loc.Address()}
						for _, ai := range loc.AttributeIndices().All() {
							kv := dict.AttributeTable().At(int(ai))
							if strs.At(int(kv.KeyStrindex())) == "profile.frame.type" {
								f.typ = kv.Value().Str()
							}
						}
						if mi := int(loc.MappingIndex()); mi > 0 {
							f.mapping = strs.At(int(dict.MappingTable().At(mi).FilenameStrindex()))
						}
						if loc.Lines().Len() > 0 {
							fn := dict.FunctionTable().At(int(loc.Lines().At(0).FunctionIndex()))
							f.name = strs.At(int(fn.NameStrindex()))
						}
						st = append(st, f)
					}
					for range s.TimestampsUnixNano().Len() {
						out = append(out, st)
					}
				}
			}
		}
	}
	return out
}

// hasFrame reports whether st holds a frame named name (any name if empty)
// of type typ (any type if empty).
func hasFrame(st []testFrame, name, typ string) bool {
	for _, f := range st {
		if (name == "" || f.name == name) && (typ == "" || f.typ == typ) {
			return true
		}
	}
	return false
}

// hiddenRuntimeStacks reads s's profiles until each of pids has n samples
// with a native frame named native ("": any native frame) and no frame of
// type typ, the runtime hidden from the profiler, or until a minute has
// passed. It fails the test for each pid short of n, and for any sample
// that holds a typ frame (at most five shown).
func hiddenRuntimeStacks(t *testing.T, s *sink, pids []int, typ, native string, n int) {
	t.Helper()
	counts := map[int]int{}
	var bad []string
	short := func() bool { return slices.ContainsFunc(pids, func(pid int) bool { return counts[pid] < n }) }
	deadline := time.Now().Add(60 * time.Second)
	read := 0
	for time.Now().Before(deadline) && short() {
		all := s.all()
		for _, pd := range all[read:] {
			for _, pid := range pids {
				for _, st := range stacksOf(pd, pid) {
					switch {
					case hasFrame(st, "", typ):
						if len(bad) < 5 {
							bad = append(bad, fmt.Sprintf("pid %d: %s frames in %v", pid, typ, st))
						}
					case hasFrame(st, native, "native"):
						counts[pid]++
					}
				}
			}
		}
		read = len(all)
		s.waitFor(read+1, time.Until(deadline))
	}
	if len(bad) > 0 {
		t.Errorf("a hidden version's process got %s frames:\n%s", typ, strings.Join(bad, "\n"))
	}
	for _, pid := range pids {
		if counts[pid] < n {
			t.Errorf("pid %d: %d samples with a native %q frame and no %s frame, want >= %d", pid, counts[pid], native, typ, n)
		}
	}
}

// logContexts returns the fields of the log entries whose message holds
// msg and whose fields mention about.
func logContexts(logs *observer.ObservedLogs, msg, about string) []string {
	var out []string
	for _, e := range logs.All() {
		if c := fmt.Sprint(e.ContextMap()); strings.Contains(e.Message, msg) && strings.Contains(c, about) {
			out = append(out, c)
		}
	}
	return out
}
