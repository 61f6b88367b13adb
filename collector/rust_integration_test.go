package collector_test

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// Frames of Rust code are typed "rust" (profile.frame.type, as the
// profiling semantic conventions name it) and named without the legacy
// mangling's hash; the C frames of the same process stay "native".
func TestRustFramesTypedRust(t *testing.T) {
	rustc := testutil.RequireTool(t, "rustc")
	bin := filepath.Join(t.TempDir(), "rustburn")
	out, err := exec.Command(rustc, "--crate-name", "rustburn", "-C", "opt-level=1", "-C", "force-frame-pointers=yes", "-o", bin,
		filepath.Join("testdata", "rustburn", "main.rs")).CombinedOutput()
	if err != nil {
		t.Fatalf("rustc: %v\n%s", err, out)
	}
	sink := startReceiver(t, 199)
	cmd := testutil.StartWorkload(t, bin)
	chain := []frame{{"rustburn::spin", "rust"}, {"rustburn::outer", "rust"}}
	s, _ := waitForSample(t, sink, cmd.Process.Pid, 30*time.Second, func(s flatSample) bool { return hasChain(s.Frames, chain) })
	if s.PID == 0 {
		return
	}
	for _, f := range s.Frames {
		if f.Function == "__libc_start_call_main" && f.Type != "native" {
			t.Errorf("libc frame typed %q, want native: %s", f.Type, functions(s.Frames))
		}
	}
}
