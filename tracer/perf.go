package tracer

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// perfEvent is one cpu-clock perf event with the sampler attached, through a
// BPF link where the kernel has them for perf events (5.15+), else through
// PERF_EVENT_IOC_SET_BPF.
type perfEvent struct {
	fd   int
	link *link.RawLink
}

func openCPUClock(cpu, freq int) (*perfEvent, error) {
	attr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_CPU_CLOCK,
		Sample: uint64(freq),
		Bits:   unix.PerfBitFreq | unix.PerfBitDisabled,
	}
	attr.Size = uint32(unsafe.Sizeof(attr))
	fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		hint := ""
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			hint = ": grant CAP_PERFMON (or lower kernel.perf_event_paranoid)"
		}
		if errors.Is(err, unix.EINVAL) {
			hint = fmt.Sprintf(": %d Hz may exceed kernel.perf_event_max_sample_rate", freq)
		}
		return nil, fmt.Errorf("perf_event_open cpu-clock on CPU %d%s: %w", cpu, hint, err)
	}
	return &perfEvent{fd: fd}, nil
}

func (pe *perfEvent) attach(prog *ebpf.Program) error {
	l, err := link.AttachRawLink(link.RawLinkOptions{
		Target:  pe.fd,
		Program: prog,
		Attach:  ebpf.AttachPerfEvent,
	})
	switch {
	case err == nil:
		pe.link = l
	case errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL):
		// Before 5.15 a perf event takes its program by ioctl.
		if err := unix.IoctlSetInt(pe.fd, unix.PERF_EVENT_IOC_SET_BPF, prog.FD()); err != nil {
			return fmt.Errorf("attach sampler to perf event: %w", err)
		}
	default:
		return fmt.Errorf("attach sampler to perf event: %w", err)
	}
	if err := unix.IoctlSetInt(pe.fd, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
		return fmt.Errorf("enable perf event: %w", err)
	}
	return nil
}

func (pe *perfEvent) close() error {
	var errs []error
	if pe.link != nil {
		errs = append(errs, pe.link.Close())
	}
	errs = append(errs, unix.Close(pe.fd))
	return errors.Join(errs...)
}

// onlineCPUs lists the CPUs in /sys/devices/system/cpu/online ("0-3,6").
func onlineCPUs() ([]int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return nil, fmt.Errorf("online CPUs: %w", err)
	}
	cpus, err := parseCPUList(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("online CPUs: %w", err)
	}
	return cpus, nil
}

func parseCPUList(s string) ([]int, error) {
	var cpus []int
	for part := range strings.SplitSeq(s, ",") {
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("cpu list %q: %w", s, err)
		}
		last := first
		if isRange {
			if last, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("cpu list %q: %w", s, err)
			}
		}
		if first < 0 || last < first || last-first > 1<<16 {
			return nil, fmt.Errorf("cpu list %q: bad range %q", s, part)
		}
		for c := first; c <= last; c++ {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) == 0 {
		return nil, fmt.Errorf("cpu list %q is empty", s)
	}
	return cpus, nil
}
