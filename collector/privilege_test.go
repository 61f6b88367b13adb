package collector_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/collector/receiver/xreceiver"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/collector"
	"github.com/sonde-dev/sonde/collector/internal/metadata"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// leastPrivilegeChildEnv carries the pid to profile to the child test.
const leastPrivilegeChildEnv = "SONDE_LEAST_PRIVILEGE_PID"

// The receiver needs exactly CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE and
// CAP_DAC_READ_SEARCH: a child running as nobody with only those profiles a
// root process with its native frames named; with fewer it refuses to start
// and names what is missing.
func TestLeastPrivilege(t *testing.T) {
	testutil.RequirePrivileges(t, "dropping privileges for a child process")
	workload := testutil.StartWorkload(t, testutil.BuildWorkload(t, testutil.CChainNoFP))
	bin := testutil.CopyForNobody(t)
	for _, tc := range []struct {
		name    string
		caps    []uintptr
		missing []string
	}{
		{"the four", []uintptr{unix.CAP_BPF, unix.CAP_PERFMON, unix.CAP_SYS_PTRACE, unix.CAP_DAC_READ_SEARCH}, nil},
		{"without ptrace and dac_read_search", []uintptr{unix.CAP_BPF, unix.CAP_PERFMON}, []string{"CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"}},
		{"without bpf", []uintptr{unix.CAP_PERFMON, unix.CAP_SYS_PTRACE, unix.CAP_DAC_READ_SEARCH}, []string{"CAP_BPF"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, "-test.run=^TestLeastPrivilegeChild$", "-test.v")
			cmd.Dir = "/"
			cmd.Env = append(os.Environ(), leastPrivilegeChildEnv+"="+strconv.Itoa(workload.Process.Pid))
			cmd.SysProcAttr = &syscall.SysProcAttr{
				Credential:  &syscall.Credential{Uid: 65534, Gid: 65534},
				AmbientCaps: tc.caps,
			}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			var started, profiled, creds string
			for line := range strings.SplitSeq(string(out), "\n") {
				if m, ok := strings.CutPrefix(line, "CREDS: "); ok {
					creds = m
				}
				if m, ok := strings.CutPrefix(line, "START: "); ok {
					started = m
				}
				if m, ok := strings.CutPrefix(line, "PROFILED: "); ok {
					profiled = m
				}
			}
			var mask uint64
			for _, c := range tc.caps {
				mask |= 1 << c
			}
			// The child ran as nobody with these capabilities and no other.
			if want := fmt.Sprintf("uid 65534 effective %016x", mask); creds != want {
				t.Fatalf("child credentials %q, want %q", creds, want)
			}
			if tc.missing == nil {
				if started != "ok" || profiled == "" {
					t.Fatalf("with %d capabilities: start %q, profiled %q; child output:\n%s", len(tc.caps), started, profiled, out)
				}
				t.Logf("as nobody with the four capabilities: %s", profiled)
				return
			}
			if started == "ok" || started == "" {
				t.Fatalf("started without %v; child output:\n%s", tc.missing, out)
			}
			for _, want := range tc.missing {
				if !strings.Contains(started, want) {
					t.Errorf("start error does not name %s: %s", want, started)
				}
			}
		})
	}
}

// TestLeastPrivilegeChild runs in the child TestLeastPrivilege starts: it
// reports whether the receiver starts and whether it profiles the workload.
func TestLeastPrivilegeChild(t *testing.T) {
	pid, err := strconv.Atoi(os.Getenv(leastPrivilegeChildEnv))
	if err != nil {
		t.Skip("runs as the child of TestLeastPrivilege")
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	var capEff string
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:\t"); ok {
			capEff = v
		}
	}
	fmt.Printf("\nCREDS: uid %d effective %s\n", os.Geteuid(), capEff)
	f := collector.NewFactory().(xreceiver.Factory)
	cfg := f.CreateDefaultConfig().(*collector.Config)
	cfg.SamplesPerSecond = 99
	cfg.ReporterInterval = 500 * time.Millisecond
	sink := new(consumertest.ProfilesSink)
	rcv, err := f.CreateProfiles(context.Background(), receivertest.NewNopSettings(metadata.Type), cfg, sink)
	if err != nil {
		t.Fatal(err)
	}
	if err := rcv.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		fmt.Printf("\nSTART: %v\n", err)
		return
	}
	defer func() {
		if err := rcv.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}()
	fmt.Printf("\nSTART: ok\n")
	s, _ := waitForSample(t, sink, pid, 30*time.Second, func(s flatSample) bool {
		return fullChain(s.Frames, []string{"c", "b", "a", "main"})
	})
	if s.Frames == nil {
		t.Fatalf("no sample of pid %d with main → a → b → c", pid)
	}
	fmt.Printf("\nPROFILED: %s\n", functions(s.Frames))
}
