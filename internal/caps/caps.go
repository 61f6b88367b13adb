// Package caps reports which Linux capabilities the calling thread lacks, so
// start-up can name exactly what to grant instead of failing later with EPERM.
package caps

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Cap is one capability with its conventional name.
type Cap struct {
	Bit  uint
	Name string
}

// Capabilities Sonde uses.
var (
	BPF         = Cap{unix.CAP_BPF, "CAP_BPF"}
	Perfmon     = Cap{unix.CAP_PERFMON, "CAP_PERFMON"}
	SysPtrace   = Cap{unix.CAP_SYS_PTRACE, "CAP_SYS_PTRACE"}
	DACReadSrch = Cap{unix.CAP_DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH"}
	SysAdmin    = Cap{unix.CAP_SYS_ADMIN, "CAP_SYS_ADMIN"}
	SysResource = Cap{unix.CAP_SYS_RESOURCE, "CAP_SYS_RESOURCE"}
)

// Profiler is the set Sonde needs: load eBPF, open perf events, and read other
// processes' maps, memory and files.
func Profiler() []Cap { return []Cap{BPF, Perfmon, SysPtrace, DACReadSrch} }

// Missing returns the names of the capabilities in want that are not in the
// calling thread's effective set. CAP_SYS_ADMIN stands in for CAP_BPF and
// CAP_PERFMON, as it does in the kernel.
func Missing(want ...Cap) ([]string, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return nil, fmt.Errorf("capget: %w", err)
	}
	has := func(c Cap) bool { return data[c.Bit/32].Effective&(1<<(c.Bit%32)) != 0 }
	var missing []string
	for _, c := range want {
		if has(c) || ((c == BPF || c == Perfmon) && has(SysAdmin)) {
			continue
		}
		missing = append(missing, c.Name)
	}
	return missing, nil
}
