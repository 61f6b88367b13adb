package tracer

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

const checkHostChildEnv = "SONDE_TEST_CHECK_HOST_CHILD"

// TestCheckHostChild is the child half of TestCheckHostNamesMissingCapabilities.
func TestCheckHostChild(t *testing.T) {
	if os.Getenv(checkHostChildEnv) == "" {
		t.Skip("runs only as the child of TestCheckHostNamesMissingCapabilities")
	}
	_, err := New(Options{SamplesPerSecond: 19})
	fmt.Printf("ERROR: %v\n", err)
}

// Without the capabilities, New fails with one error that names each missing
// capability and how to grant it. The test runs itself again as nobody, whose
// capability sets are empty.
func TestCheckHostNamesMissingCapabilities(t *testing.T) {
	testutil.RequirePrivileges(t, "dropping privileges for a child process")
	bin := testutil.CopyForNobody(t)
	cmd := exec.Command(bin, "-test.run=^TestCheckHostChild$", "-test.v")
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), checkHostChildEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var msg string
	for line := range strings.SplitSeq(string(out), "\n") {
		if m, ok := strings.CutPrefix(line, "ERROR: "); ok {
			msg = m
		}
	}
	if msg == "" || msg == "<nil>" {
		t.Fatalf("New succeeded without capabilities; child output:\n%s", out)
	}
	for _, want := range []string{"CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "setcap", "capabilities.add"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %s: %s", want, msg)
		}
	}
}
