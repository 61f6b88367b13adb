//go:build linux

package collector_test

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// TestPHPAgainstTicks runs oracle.php, whose own tick function samples it
// with debug_backtrace() once a millisecond, on Debian's PHP 8.2 under the
// receiver: the share of leaf_a among the samples in leaf_a or leaf_b
// (Sonde: the innermost of them in a sample's PHP frames) agrees with
// PHP's own within 5 points, on the same process over the same run.
func TestPHPAgainstTicks(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	requirePHP(t)
	sink := startReceiver(t, jvmRate)
	warmPHP(t, sink, testutil.PHP82(t), phpScript(t, "burn.php"))
	out := filepath.Join(t.TempDir(), "ticks.json")
	cmd := exec.Command(phpBin, phpScript(t, "oracle.php"), out)
	cmd.Stderr = os.Stderr
	testutil.StartReady(t, cmd, 30*time.Second)
	pid := int64(cmd.Process.Pid)

	const n = 600 // Sonde's samples in the two leaves
	ours := map[string]int{}
	deadline := time.Now().Add(3 * time.Minute)
	read := 0
	for time.Now().Before(deadline) && ours["leaf_a"]+ours["leaf_b"] < n {
		all := sink.AllProfiles()
		for _, pd := range all[read:] {
			for _, s := range jvmFlatten(pd) {
				if s.PID != pid {
					continue
				}
				for _, f := range phpFrames(s) {
					if f.Type == "php" && (f.Function == "leaf_a" || f.Function == "leaf_b") {
						ours[f.Function] += s.Count
						break
					}
				}
			}
		}
		read = len(all)
		waitForExport(sink, read, time.Until(deadline))
	}
	// PHP writes its counts every half second: the last write after ours.
	time.Sleep(1200 * time.Millisecond)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var theirs map[string]int
	if err := json.Unmarshal(b, &theirs); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	share := func(c map[string]int) float64 {
		return 100 * float64(c["leaf_a"]) / float64(max(c["leaf_a"]+c["leaf_b"], 1))
	}
	t.Logf("Sonde: leaf_a %d, leaf_b %d (leaf_a %.1f %%); PHP's ticks: %v (leaf_a %.1f %%)",
		ours["leaf_a"], ours["leaf_b"], share(ours), theirs, share(theirs))
	if ours["leaf_a"]+ours["leaf_b"] < n {
		t.Errorf("%d Sonde samples in the leaves, want %d", ours["leaf_a"]+ours["leaf_b"], n)
	}
	if theirs["leaf_a"]+theirs["leaf_b"] < 100 {
		t.Errorf("%d tick samples in the leaves, want 100", theirs["leaf_a"]+theirs["leaf_b"])
	}
	if d := math.Abs(share(ours) - share(theirs)); d > 5 {
		t.Errorf("leaf_a's share differs by %.1f points", d)
	}
}
