//go:build linux

package profiler

import (
	"path"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/tracer"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat's start time: 100 on
// every Linux architecture Sonde runs on.
const clockTicks = 100

// filterPending is how long the kernel drops a freshly exec'd process's
// samples while user space decides about it; past it, an undecided process
// is sampled and asked about again.
const filterPending = time.Second

// procFilter decides, once per process image, whether it is profiled. It is
// safe for concurrent use: the preparer decides and tells the kernel, the
// resolver drops what was sampled before the kernel knew.
type procFilter struct {
	cfg    Filters
	minAge time.Duration
	active bool // some rule can exclude a process

	mu      sync.Mutex
	decided map[int]decision
}

// decision is what was decided for one process image (pid, start time).
type decision struct {
	start    uint64
	excluded bool
	// comesOfAge is when a process excluded for its age reaches the
	// minimum age; zero for a lasting decision.
	comesOfAge ktime
}

// ktime is a point in time on CLOCK_MONOTONIC, in nanoseconds: the clock of
// the kernel's bpf_ktime_get_ns.
type ktime uint64

func newProcFilter(o *Options) *procFilter {
	f := o.Filters
	return &procFilter{
		cfg:    f,
		minAge: o.FilterMinProcessAge,
		active: len(f.IncludeExecutables) > 0 || len(f.ExcludeExecutables) > 0 ||
			f.Containers != ContainersAny && f.Containers != "" ||
			len(f.IncludeCgroups) > 0 || len(f.ExcludeCgroups) > 0 || o.FilterMinProcessAge > 0,
		decided: make(map[int]decision),
	}
}

// decide returns the decision for p, made on first sight of this image.
// A decision for its age expires when the process comes of age.
func (f *procFilter) decide(p *process.Process) decision {
	if !f.active {
		return decision{}
	}
	now := monotonic()
	f.mu.Lock()
	d, ok := f.decided[p.PID]
	f.mu.Unlock()
	if ok && d.start == p.StartTime && (d.comesOfAge == 0 || now < d.comesOfAge) {
		return d
	}
	d = decision{start: p.StartTime, excluded: !f.matches(p)}
	if !d.excluded && f.minAge > 0 {
		if age := processAge(p); age < f.minAge {
			d.excluded, d.comesOfAge = true, now.add(f.minAge-age)
		}
	}
	f.mu.Lock()
	f.decided[p.PID] = d
	f.mu.Unlock()
	return d
}

// forget drops pid's decision (exec, exit).
func (f *procFilter) forget(pid int) {
	if !f.active {
		return
	}
	f.mu.Lock()
	delete(f.decided, pid)
	f.mu.Unlock()
}

// kernelUntil is the decision as the kernel's pid_filter holds it.
func (d decision) kernelUntil() uint64 {
	switch {
	case !d.excluded:
		return 0
	case d.comesOfAge == 0:
		return tracer.ExcludeForever
	default:
		return uint64(d.comesOfAge)
	}
}

// matches reports whether p passes every filter rule.
func (f *procFilter) matches(p *process.Process) bool {
	if p.KernelThread {
		return f.cfg.IncludeKernelThreads
	}
	if len(f.cfg.IncludeExecutables) > 0 && !matchAny(f.cfg.IncludeExecutables, p) {
		return false
	}
	if matchAny(f.cfg.ExcludeExecutables, p) {
		return false
	}
	switch f.cfg.Containers {
	case ContainersOnly:
		if p.ContainerID == "" {
			return false
		}
	case ContainersNone:
		if p.ContainerID != "" {
			return false
		}
	}
	if len(f.cfg.IncludeCgroups) > 0 && !underAny(f.cfg.IncludeCgroups, p.CgroupPath) {
		return false
	}
	return !underAny(f.cfg.ExcludeCgroups, p.CgroupPath)
}

// matchAny reports whether p's executable matches one of the globs: by path
// for a glob with a '/', else by name.
func matchAny(globs []string, p *process.Process) bool {
	for _, g := range globs {
		subject := p.Name
		if strings.Contains(g, "/") {
			subject = p.ExePath
		}
		if ok, _ := path.Match(g, subject); ok && subject != "" {
			return true
		}
	}
	return false
}

// underAny reports whether cgroup is one of the paths or below one.
func underAny(prefixes []string, cgroup string) bool {
	for _, pre := range prefixes {
		pre = strings.TrimSuffix(pre, "/")
		if pre == "" || cgroup == pre || strings.HasPrefix(cgroup, pre+"/") {
			return true
		}
	}
	return false
}

// processAge is how long p has run, from its start time since boot.
func processAge(p *process.Process) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	started := time.Duration(p.StartTime) * (time.Second / clockTicks)
	return max(time.Duration(ts.Nano())-started, 0)
}

// monotonic is the time now on CLOCK_MONOTONIC.
func monotonic() ktime {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ktime(ts.Nano())
}

// add is t moved by d.
func (t ktime) add(d time.Duration) ktime { return ktime(int64(t) + int64(d)) }

// sub is how long after u t comes.
func (t ktime) sub(u ktime) time.Duration { return time.Duration(int64(t) - int64(u)) }
