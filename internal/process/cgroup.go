package process

import (
	"strings"
)

// maxCgroupLen bounds a read of /proc/PID/cgroup: one line per v1 hierarchy
// (about a dozen) plus the v2 line, each with a path of at most a few hundred
// bytes in practice.
const maxCgroupLen = 64 << 10

// containerPrefixes are the prefixes container runtimes give the cgroup of a
// container when systemd manages cgroups ("docker-<id>.scope") or, for some,
// under cgroupfs ("crio-<id>", "libpod-<id>").
var containerPrefixes = [...]string{"docker-", "cri-containerd-", "crio-", "libpod-"}

// ContainerIDFromCgroup returns the id of the container a cgroup belongs to,
// or "" when the cgroup is not a container's. s is a cgroup path
// ("/kubepods/burstable/pod<uid>/<id>") or a whole line of /proc/PID/cgroup
// ("12:memory:/docker/<id>", "0::/system.slice/docker-<id>.scope").
//
// A path segment names a container when it is 64 lower-case hex digits
// (Docker and Kubernetes with cgroupfs, containerd) or one of
// docker-, cri-containerd-, crio-, libpod- followed by 64 hex digits and an
// optional ".scope" (systemd-managed cgroups, CRI-O, Podman). Runtime helper
// cgroups such as "crio-conmon-<id>.scope" and "libpod-conmon-<id>.scope"
// are not containers. When segments nest (a container in a container), the
// innermost id wins. Paths as a reader in another cgroup namespace sees them
// ("0::/../../kubepods/...") are read alike.
func ContainerIDFromCgroup(s string) string {
	if !strings.HasPrefix(s, "/") {
		// "hierarchy-id:controllers:path"; the path may contain ':'.
		_, after, ok := strings.Cut(s, ":")
		if !ok {
			return ""
		}
		_, path, ok := strings.Cut(after, ":")
		if !ok {
			return ""
		}
		s = path
	}
	id := ""
	for seg := range strings.SplitSeq(s, "/") {
		if c := containerIDFromSegment(seg); c != "" {
			id = c
		}
	}
	return id
}

func containerIDFromSegment(seg string) string {
	if isContainerID(seg) {
		return seg
	}
	seg = strings.TrimSuffix(seg, ".scope")
	for _, p := range containerPrefixes {
		if id, ok := strings.CutPrefix(seg, p); ok && isContainerID(id) {
			return id
		}
	}
	return ""
}

// isContainerID reports whether s is 64 lower-case hex digits, the form of
// Docker, containerd, CRI-O and Podman container ids.
func isContainerID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// cgroupInfo is what /proc/PID/cgroup says about a process.
type cgroupInfo struct {
	// Path is the cgroup v2 path when the process has one other than the
	// root, else the deepest v1 path, else "/" or "".
	Path        string
	ContainerID string
}

// parseCgroup parses /proc/PID/cgroup, which on a unified hierarchy is one
// "0::/path" line and on v1 or hybrid hosts holds a line per hierarchy
// ("4:memory:/docker/<id>"). The container id is taken from the v2 path when
// it names one, else from the first v1 line that does.
func parseCgroup(data string) cgroupInfo {
	var (
		v2, deepest string
		haveV2      bool
		depth       = -1
		v1IDs       string
	)
	for line := range strings.SplitSeq(data, "\n") {
		hier, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		ctrls, path, ok := strings.Cut(rest, ":")
		if !ok || !strings.HasPrefix(path, "/") {
			continue
		}
		if hier == "0" && ctrls == "" {
			v2, haveV2 = path, true
			continue
		}
		if d := strings.Count(strings.TrimRight(path, "/"), "/"); d > depth {
			deepest, depth = path, d
		}
		if v1IDs == "" {
			v1IDs = ContainerIDFromCgroup(path)
		}
	}
	var info cgroupInfo
	switch {
	case haveV2 && (v2 != "/" || deepest == "" || deepest == "/"):
		info.Path = v2
	default:
		info.Path = deepest
	}
	if haveV2 {
		info.ContainerID = ContainerIDFromCgroup(v2)
	}
	if info.ContainerID == "" {
		info.ContainerID = v1IDs
	}
	return info
}
