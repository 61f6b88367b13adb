package python

import (
	"encoding/hex"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestLineTablesMatchInterpreter compares the decoders with the lines each
// interpreter computes itself for every instruction of real code: the
// workload and a large stdlib module.
func TestLineTablesMatchInterpreter(t *testing.T) {
	for _, in := range installedInterpreters(t) {
		t.Run(in.version, func(t *testing.T) {
			std, err := exec.Command(in.bin, "-c", "import asyncio.base_events as m; print(m.__file__, end='')").Output()
			if err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(in.bin, filepath.Join("testdata", "linetables.py"), workloadPath(t), string(std)).Output()
			if err != nil {
				t.Fatal(err)
			}
			var codes []struct {
				Name  string
				First int64
				Table string
				Lines [][2]int64
			}
			if err := json.Unmarshal(out, &codes); err != nil {
				t.Fatal(err)
			}
			l, _ := LayoutFor(in.minor)
			checked := 0
			for _, co := range codes {
				tab, err := hex.DecodeString(co.Table)
				if err != nil {
					t.Fatal(err)
				}
				c := &Code{FirstLine: co.First, table: tab, kind: l.lineTableKind(), bytecode: 0x1000}
				for _, ol := range co.Lines {
					off, want := ol[0], ol[1]
					var instr uint64
					switch c.kind {
					case tableLnotab:
						instr = uint64(off)
					case table310:
						instr = uint64(off / 2)
					default:
						instr = c.bytecode + uint64(off)
					}
					if got := c.Line(instr); got != want {
						t.Errorf("%s offset %d: line %d, want %d", co.Name, off, got, want)
					}
					checked++
				}
			}
			if checked < 1000 {
				t.Errorf("only %d instructions checked", checked)
			}
		})
	}
}
