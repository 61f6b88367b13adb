package unwind

import (
	"debug/elf"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/tracer"
)

func TestEndAtEntry(t *testing.T) {
	sp := func(pc uint64) Row { return Row{PC: pc, CFA: CFASP, CFAOffset: 8} }
	gap := func(pc uint64) Row { return Row{PC: pc} }
	end := func(pc uint64) Row { return Row{PC: pc, CFA: CFAEnd} }
	// Two FDEs, [0x100, 0x140) and [0x200, 0x240), with a gap between.
	rows := []Row{sp(0x100), gap(0x140), sp(0x200), gap(0x240)}
	for _, tc := range []struct {
		name  string
		entry uint64
		want  []Row
	}{
		{"in a gap", 0x170, []Row{sp(0x100), gap(0x140), end(0x170), sp(0x200), gap(0x240)}},
		{"at a gap's start", 0x140, []Row{sp(0x100), end(0x140), sp(0x200), gap(0x240)}},
		{"before the first FDE", 0x80, []Row{end(0x80), sp(0x100), gap(0x140), sp(0x200), gap(0x240)}},
		{"covered by an FDE", 0x110, rows},
		{"after the last FDE", 0x300, rows},
		{"none", 0, rows},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := &Table{Rows: rows}
			got := in.EndAtEntry(tc.entry)
			if diff := cmp.Diff(tc.want, got.Rows); diff != "" {
				t.Errorf("EndAtEntry(%#x) rows (-want +got):\n%s", tc.entry, diff)
			}
			if diff := cmp.Diff([]Row{sp(0x100), gap(0x140), sp(0x200), gap(0x240)}, in.Rows); diff != "" {
				t.Errorf("EndAtEntry changed its receiver (-want +got):\n%s", diff)
			}
		})
	}
}

// glibc's dynamic loader has no CFI at its entry (_start, _dl_start_user):
// its table ends the stack there, so a process sampled in its start-up
// code, before main, is whole.
func TestLoaderEntryEndsStack(t *testing.T) {
	const ldso = "/lib64/ld-linux-x86-64.so.2"
	f, err := elf.Open(ldso)
	if err != nil {
		t.Skipf("no glibc dynamic loader at %s: %v", ldso, err)
	}
	defer f.Close()
	var off uint64
	found := false
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && f.Entry >= p.Vaddr && f.Entry < p.Vaddr+p.Filesz {
			off, found = f.Entry-p.Vaddr+p.Off, true
		}
	}
	if !found {
		t.Fatalf("entry %#x of %s is in no loaded segment", f.Entry, ldso)
	}
	lf, rows, mem := buildFile(ldso, nil, zap.NewNop())
	t.Cleanup(mem.run)
	if lf.err != nil {
		t.Fatalf("build %s: %v", ldso, lf.err)
	}
	rel := off - lf.base
	i := sort.Search(len(rows), func(i int) bool { return uint64(rows[i].Pc) > rel }) - 1
	if i < 0 {
		t.Fatalf("no row covers the entry %#x of %s", f.Entry, ldso)
	}
	if cfa, _, _, _ := tracer.RowRule(rows[i]); cfa != tracer.CFAEnd {
		t.Errorf("row covering the entry %#x of %s has CFA rule %d, want the end rule %d", f.Entry, ldso, cfa, tracer.CFAEnd)
	}
}
