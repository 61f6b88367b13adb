package symbolize

import (
	"debug/elf"
	"fmt"
	"os/exec"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// A file opened through the root of a short-lived process that shares the
// host's root is still named once that process is gone: its host path is
// remembered too.
func TestSymbolizeAfterProcessExit(t *testing.T) {
	bin := testutil.BuildWorkload(t, testutil.CChain)
	cmd := exec.Command(bin)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := New(nil, Options{})
	info, err := s.Open(fmt.Sprintf("/proc/%d/root%s", cmd.Process.Pid, bin))
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err != nil {
		t.Fatal(err)
	}

	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, err := ef.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	text := ef.Section(".text")
	var off uint64
	for _, sym := range syms {
		if sym.Name == "c" {
			off = sym.Value - text.Addr + text.Offset
		}
	}
	if off == 0 {
		t.Fatal("no symbol c in the workload")
	}
	frames, err := s.Symbolize(info.ID, off)
	if err != nil {
		t.Fatalf("Symbolize after the process exited: %v", err)
	}
	if len(frames) == 0 || frames[len(frames)-1].Function != "c" {
		t.Errorf("frames at c's entry = %+v, want c", frames)
	}
}
