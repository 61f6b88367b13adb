package process

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// maxStatusLen bounds a read of /proc/PID/status. NSpid comes within its
// first lines; only a Groups line of thousands of supplementary groups can
// push it past the bound, and then the namespace PID is not known.
const maxStatusLen = 16 << 10

var errStatusSyntax = errors.New("malformed status")

// parseNSpid returns the PIDs of the NSpid line of /proc/PID/status: the
// process's PID in each PID namespace from the one procfs belongs to down to
// the process's own ("NSpid:\t4242\t7\t1"). found is false when there is no
// NSpid line (kernels before 4.1, or a line beyond the read bound).
func parseNSpid(data []byte) (pids []int, found bool, err error) {
	const key = "NSpid:"
	var line []byte
	for rest := data; len(rest) > 0; {
		l := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			l, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		if bytes.HasPrefix(l, []byte(key)) {
			line, found = l[len(key):], true
			break
		}
	}
	if !found {
		return nil, false, nil
	}
	for _, f := range bytes.Fields(line) {
		pid, err := strconv.Atoi(string(f))
		if err != nil || pid <= 0 {
			return nil, true, fmt.Errorf("%w: NSpid field %q", errStatusSyntax, f)
		}
		pids = append(pids, pid)
	}
	if len(pids) == 0 {
		return nil, true, fmt.Errorf("%w: empty NSpid", errStatusSyntax)
	}
	return pids, true, nil
}
