package process

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	id1 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	id2 = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
)

func TestContainerIDFromCgroup(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"docker cgroupfs", "/docker/" + id1, id1},
		{"docker systemd", "/system.slice/docker-" + id1 + ".scope", id1},
		{"kubernetes cgroupfs containerd", "/kubepods/burstable/pod0f3b6a2c-1a2b-4c3d-9e8f-0123456789ab/" + id1, id1},
		{"kubernetes guaranteed cgroupfs", "/kubepods/pod0f3b6a2c-1a2b-4c3d-9e8f-0123456789ab/" + id1, id1},
		{"kubernetes systemd containerd",
			"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f3b6a2c_1a2b_4c3d_9e8f_0123456789ab.slice/cri-containerd-" + id1 + ".scope", id1},
		{"kubernetes systemd docker",
			"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podabc.slice/docker-" + id1 + ".scope", id1},
		{"cri-o systemd", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podabc.slice/crio-" + id1 + ".scope", id1},
		{"cri-o cgroupfs", "/kubepods/burstable/podabc/crio-" + id1, id1},
		{"podman", "/machine.slice/libpod-" + id1 + ".scope", id1},
		{"podman container subgroup", "/machine.slice/libpod-" + id1 + ".scope/container", id1},
		{"podman user session", "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + id1 + ".scope", id1},
		{"v1 line", "12:memory:/docker/" + id1, id1},
		{"v1 named hierarchy line", "1:name=systemd:/system.slice/docker-" + id1 + ".scope", id1},
		{"v2 line", "0::/system.slice/docker-" + id1 + ".scope", id1},
		{"v2 line with colon in path", "0::/a:b/docker/" + id1, id1},
		{"docker rootless", "/user.slice/user-1000.slice/user@1000.service/docker-" + id1 + ".scope", id1},
		{"kubernetes cgroupfs cri-o", "/kubepods/besteffort/pod0f3b6a2c-1a2b-4c3d-9e8f-0123456789ab/crio-" + id1, id1},
		{"kubernetes systemd guaranteed",
			"/kubepods.slice/kubepods-pod0f3b6a2c_1a2b_4c3d_9e8f_0123456789ab.slice/cri-containerd-" + id1 + ".scope", id1},
		{"podman cgroupfs", "/libpod_parent/libpod-" + id1, id1},
		{"seen from a cgroup namespace", "0::/../../kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podabc.slice/cri-containerd-" + id1 + ".scope", id1},
		{"aws ecs", "/ecs/0123456789abcdef0123456789abcdef/" + id1, id1},
		{"process in a container's sub-cgroup", "/system.slice/docker-" + id1 + ".scope/init.scope", id1},
		{"nested container: innermost wins", "/docker/" + id1 + "/docker/" + id2, id2},
		{"nested under a kubernetes pod: innermost wins", "/kubepods/burstable/podabc/" + id1 + "/system.slice/docker-" + id2 + ".scope", id2},
		{"host root", "/", ""},
		{"host v2 line", "0::/init.scope", ""},
		{"user session", "0::/user.slice/user-1000.slice/session-3.scope", ""},
		{"docker daemon", "/system.slice/docker.service", ""},
		{"containerd daemon", "/system.slice/containerd.service", ""},
		{"crio conmon is not the container", "/machine.slice/crio-conmon-" + id1 + ".scope", ""},
		{"crio conmon under kubernetes", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podabc.slice/crio-conmon-" + id1 + ".scope", ""},
		{"crio conmon cgroupfs", "/kubepods/burstable/podabc/crio-conmon-" + id1, ""},
		{"kubernetes pod without a container", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f3b6a2c_1a2b_4c3d_9e8f_0123456789ab.slice", ""},
		{"prefix twice", "/system.slice/docker-docker-" + id1 + ".scope", ""},
		{"scope suffix twice", "/system.slice/docker-" + id1 + ".scope.scope", ""},
		{"libpod conmon is not the container", "/machine.slice/libpod-conmon-" + id1 + ".scope", ""},
		{"unknown runtime prefix", "/system.slice/app-" + id1 + ".scope", ""},
		{"hex inside a longer segment", "/system.slice/x" + id1, ""},
		{"hex with suffix", "/docker/" + id1 + "-init", ""},
		{"63 hex digits", "/docker/" + id1[:63], ""},
		{"65 hex digits", "/docker/" + id1 + "0", ""},
		{"upper-case hex", "/docker/" + strings.ToUpper(id1), ""},
		{"wrong unit suffix", "/system.slice/docker-" + id1 + ".mount", ""},
		{"line without path", "12:memory", ""},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ContainerIDFromCgroup(tt.in); got != tt.want {
				t.Errorf("ContainerIDFromCgroup(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseCgroup(t *testing.T) {
	tests := []struct {
		name, in string
		want     cgroupInfo
	}{
		{
			name: "unified host",
			in:   "0::/user.slice/user-0.slice/session-1.scope\n",
			want: cgroupInfo{Path: "/user.slice/user-0.slice/session-1.scope"},
		},
		{
			name: "unified container",
			in:   "0::/system.slice/docker-" + id1 + ".scope\n",
			want: cgroupInfo{Path: "/system.slice/docker-" + id1 + ".scope", ContainerID: id1},
		},
		{
			name: "hybrid: v2 root, deepest v1 path",
			in: "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/a3d4c9951b00bba307014f122b13b540\n" +
				"3:cpuset:/\n0::/\n",
			want: cgroupInfo{Path: "/process_api/a3d4c9951b00bba307014f122b13b540"},
		},
		{
			name: "hybrid docker cgroupfs",
			in:   "12:memory:/docker/" + id1 + "\n11:pids:/docker/" + id1 + "\n1:name=systemd:/docker/" + id1 + "\n0::/\n",
			want: cgroupInfo{Path: "/docker/" + id1, ContainerID: id1},
		},
		{
			name: "hybrid: v2 path preferred when not root",
			in:   "4:memory:/a/b/c\n0::/system.slice/x.service\n",
			want: cgroupInfo{Path: "/system.slice/x.service"},
		},
		{
			name: "hybrid: the v2 container wins over a v1 one",
			in:   "9:name=systemd:/docker/" + id2 + "\n4:memory:/docker/" + id2 + "\n0::/system.slice/docker-" + id1 + ".scope\n",
			want: cgroupInfo{Path: "/system.slice/docker-" + id1 + ".scope", ContainerID: id1},
		},
		{
			name: "hybrid: v2 without a container, first v1 line with one",
			in:   "9:name=systemd:/user.slice\n8:pids:/docker/" + id2 + "\n4:memory:/docker/" + id1 + "\n0::/user.slice/session-1.scope\n",
			want: cgroupInfo{Path: "/user.slice/session-1.scope", ContainerID: id2},
		},
		{
			name: "hybrid: crio conmon in v2 is no container",
			in:   "4:memory:/\n0::/machine.slice/crio-conmon-" + id1 + ".scope\n",
			want: cgroupInfo{Path: "/machine.slice/crio-conmon-" + id1 + ".scope"},
		},
		{
			name: "v1 only",
			in:   "3:cpu,cpuacct:/kubepods/besteffort/podabc/" + id2 + "\n2:memory:/kubepods/besteffort/podabc/" + id2 + "\n",
			want: cgroupInfo{Path: "/kubepods/besteffort/podabc/" + id2, ContainerID: id2},
		},
		{
			name: "v2 root only",
			in:   "0::/\n",
			want: cgroupInfo{Path: "/"},
		},
		{
			name: "garbage",
			in:   "garbage\n::\n1:x:relative\n",
			want: cgroupInfo{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, parseCgroup(tt.in)); diff != "" {
				t.Errorf("parseCgroup() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzContainerIDFromCgroup(f *testing.F) {
	f.Add("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podabc.slice/cri-containerd-" + id1 + ".scope")
	f.Add("12:memory:/docker/" + id1)
	f.Add("0::/machine.slice/libpod-" + id1 + ".scope/container")
	f.Add("/docker/" + id1 + "/docker/" + id2)
	f.Add("0::/")
	f.Add("4:memory:/\n0::/machine.slice/crio-conmon-" + id1 + ".scope\n")
	f.Add("0::/../../kubepods/burstable/podabc/crio-" + id1 + "\n1:name=systemd:/libpod_parent/libpod-" + id2 + "\n")
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		f.Add(string(b))
	}
	f.Fuzz(func(t *testing.T, in string) {
		id := ContainerIDFromCgroup(in)
		if id != "" && (!isContainerID(id) || !strings.Contains(in, id)) {
			t.Fatalf("ContainerIDFromCgroup(%q) = %q, not a 64-hex substring of the input", in, id)
		}
		info := parseCgroup(in)
		if info.ContainerID != "" && !strings.Contains(in, info.ContainerID) {
			t.Fatalf("parseCgroup(%q) = %+v, id not in the input", in, info)
		}
		if !strings.Contains(in, info.Path) {
			t.Fatalf("parseCgroup(%q) = %+v, path not in the input", in, info)
		}
	})
}
