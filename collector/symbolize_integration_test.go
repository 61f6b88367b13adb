package collector_test

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/collector"
	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// A stripped program whose debug information sits only in a separate file
// under a build-id directory is named, with files and lines, once that
// directory is in symbolization::debug_dirs.
func TestStrippedProgramNamedFromDebugFile(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	objcopy := testutil.RequireTool(t, "objcopy")
	bin := testutil.BuildC(t, "cchain-debug", []string{"-O2", "-g", "-fomit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline"},
		testutil.WorkloadSource(t, testutil.CChain))
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	id, err := elfx.GNUBuildID(f)
	f.Close()
	if err != nil || len(id) < 4 {
		t.Fatalf("build id %q: %v", id, err)
	}
	debugDir := t.TempDir()
	debugFile := filepath.Join(debugDir, ".build-id", id[:2], id[2:]+".debug")
	if err := os.MkdirAll(filepath.Dir(debugFile), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--only-keep-debug", bin, debugFile}, {"--strip-all", bin}} {
		if out, err := exec.Command(objcopy, args...).CombinedOutput(); err != nil {
			t.Fatalf("objcopy %v: %v\n%s", args, err, out)
		}
	}

	sink := startReceiver(t, 199, func(c *collector.Config) {
		c.Symbolization.DebugDirs = []string{debugDir}
	})
	cmd := testutil.StartWorkload(t, bin)
	chain := []frame{{"c", "native"}, {"b", "native"}, {"a", "native"}, {"main", "native"}}
	s, _ := waitForSample(t, sink, cmd.Process.Pid, 30*time.Second, func(s flatSample) bool { return hasChain(s.Frames, chain) })
	if s.PID == 0 {
		return
	}
	for i, fr := range s.Frames {
		if fr.Type != "native" || !strings.HasSuffix(s.Files[i], "cchain.c") {
			continue
		}
		if s.Lines[i] <= 0 {
			t.Errorf("frame %s in %s has no line", fr.Function, s.Files[i])
		}
	}
	named := 0
	for i := range s.Frames {
		if strings.HasSuffix(s.Files[i], "cchain.c") && s.Lines[i] > 0 {
			named++
		}
	}
	if named < len(chain) {
		t.Errorf("%d frames carry cchain.c and a line, want the %d of the chain: %s (files %q)", named, len(chain), functions(s.Frames), s.Files)
	}
}

// With symbolization::native off, native frames keep only their addresses
// and mappings; kernel frames are still named.
func TestNativeSymbolizationOff(t *testing.T) {
	sink := startReceiver(t, 199, func(c *collector.Config) { c.Symbolization.Native = false })
	bin := testutil.BuildWorkload(t, testutil.CChain)
	cmd := testutil.StartWorkload(t, bin)
	s, _ := waitForSample(t, sink, cmd.Process.Pid, 30*time.Second, func(s flatSample) bool {
		native := 0
		for _, f := range s.Frames {
			if f.Type == "native" {
				native++
			}
		}
		return native >= 4
	})
	for _, f := range s.Frames {
		if f.Type == "native" && f.Function != "" {
			t.Errorf("native frame named %q with native symbolization off", f.Function)
		}
	}
}
