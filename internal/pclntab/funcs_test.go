package pclntab

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// goroot is the GOROOT of the go tool that builds the fixtures; its
// sources are the oracle for what the linker writes.
func goroot(tb testing.TB) string {
	tb.Helper()
	out, err := exec.Command(testutil.RequireTool(tb, "go"), "env", "GOROOT").Output()
	if err != nil {
		tb.Fatalf("go env GOROOT: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func readSource(t *testing.T, root string, parts ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(append([]string{root, "src"}, parts...)...))
	if err != nil {
		t.Skipf("toolchain sources: %v", err)
	}
	return string(b)
}

// funcIDOracle reads the FuncID numbering from the toolchain's sources:
// the order of internal/abi's FuncID constants (iota) and the names
// cmd/internal/objabi gives them. It returns the FuncID of each special
// runtime function and the one of wrappers.
func funcIDOracle(t *testing.T, root string) (byName map[string]uint8, wrapper uint8) {
	t.Helper()
	abi := readSource(t, root, "internal", "abi", "symtab.go")
	_, block, ok := strings.Cut(abi, "type FuncID uint8")
	if ok {
		_, block, ok = strings.Cut(block, "const (")
	}
	if ok {
		block, _, ok = strings.Cut(block, ")")
	}
	if !ok {
		t.Fatal("oracle: no FuncID constants in internal/abi/symtab.go")
	}
	value := map[string]uint8{}
	for _, m := range regexp.MustCompile(`(?m)^\s*(FuncID\w*)`).FindAllStringSubmatch(block, -1) {
		value[m[1]] = uint8(len(value))
	}
	wrapper, ok = value["FuncIDWrapper"]
	if !ok || value["FuncIDNormal"] != 0 {
		t.Fatalf("oracle: unexpected FuncID constants %v", value)
	}
	byName = map[string]uint8{}
	objabi := readSource(t, root, "cmd", "internal", "objabi", "funcid.go")
	for _, m := range regexp.MustCompile(`"(\w+)":\s*abi\.(FuncID\w+)`).FindAllStringSubmatch(objabi, -1) {
		v, ok := value[m[2]]
		if !ok {
			t.Fatalf("oracle: objabi names unknown constant %s", m[2])
		}
		byName["runtime."+m[1]] = v
	}
	if len(byName) < 10 {
		t.Fatalf("oracle: only %d named FuncIDs in objabi", len(byName))
	}
	return byName, wrapper
}

var reText = regexp.MustCompile(`^TEXT\s+(\w*)·(\w+)(<\w*>)?\(SB\),\s*([A-Z|$0-9]+)`)

// asmOracle reads linux/amd64 runtime assembly: the functions whose TEXT
// line carries TOPFRAME, and those whose body moves a register or memory
// into SP, which the assembler must flag as writing SP.
func asmOracle(t *testing.T, root string) (topFrame, spWrite map[string]bool) {
	t.Helper()
	topFrame, spWrite = map[string]bool{}, map[string]bool{}
	reMoveSP := regexp.MustCompile(`^\s*MOVQ\s+[^,]+,\s*SP\s*(//.*)?$`)
	for _, file := range []string{"asm_amd64.s", "sys_linux_amd64.s"} {
		cur := ""
		for _, line := range strings.Split(readSource(t, root, "runtime", file), "\n") {
			if strings.HasPrefix(line, "TEXT") {
				cur = ""
			}
			if m := reText.FindStringSubmatch(line); m != nil {
				pkg := m[1]
				if pkg == "" {
					pkg = "runtime"
				}
				if m[3] == "<>" || pkg != "runtime" {
					continue // file-local symbols and other packages' functions
				}
				cur = "runtime." + m[2]
				if strings.Contains(m[4], "TOPFRAME") {
					topFrame[cur] = true
				}
				continue
			}
			if cur != "" && reMoveSP.MatchString(line) {
				spWrite[cur] = true
			}
		}
	}
	if len(topFrame) == 0 || len(spWrite) == 0 {
		t.Fatalf("oracle: TOPFRAME functions %v, SP writers %v", topFrame, spWrite)
	}
	return topFrame, spWrite
}

// Funcs lists what debug/gosym lists, in address order, with the FuncID
// and flags the toolchain's sources say the linker writes.
func TestFuncsAgreeWithToolchain(t *testing.T) {
	root := goroot(t)
	ids, wrapperID := funcIDOracle(t, root)
	topFrame, spWrite := asmOracle(t, root)
	t.Logf("oracle: TOPFRAME %v; SP writers %v", topFrame, spWrite)
	for name, build := range map[string]func(t *testing.T) string{
		"fixture": func(t *testing.T) string { return testutil.BuildGo(t, "inlprog", "testdata/inlprog") },
		"go-tool": func(t *testing.T) string { return goToolBinary(t) },
	} {
		t.Run(name, func(t *testing.T) {
			bin := build(t)
			tab, ref := openELF(t, bin), gosymTable(t, bin)
			var got []Func
			if err := tab.Funcs(func(f Func) bool { got = append(got, f); return true }); err != nil {
				t.Fatal(err)
			}
			if len(got) != len(ref.Funcs) {
				t.Fatalf("%d functions, gosym has %d", len(got), len(ref.Funcs))
			}
			seenTop, seenSP := 0, 0
			for i, f := range got {
				rf := ref.Funcs[i]
				name := tab.FuncName(f)
				if f.Entry != rf.Entry || f.End != rf.End || name != rf.Name {
					t.Fatalf("function %d: %s [%#x, %#x), gosym %s [%#x, %#x)", i, name, f.Entry, f.End, rf.Name, rf.Entry, rf.End)
				}
				if f.ID == wrapperID {
					// An ABI wrapper carries the name of the function it
					// calls, neither its FuncID nor its flags.
					if f.Flag&(FlagTopFrame|FlagSPWrite) != 0 {
						t.Errorf("%s: wrapper with flags %03b", name, f.Flag)
					}
					continue
				}
				if want, special := ids[name]; special && f.ID != want {
					t.Errorf("%s: FuncID %d, want %d", name, f.ID, want)
				} else if !special && f.ID != 0 {
					t.Errorf("%s: FuncID %d, want 0", name, f.ID)
				}
				if top := f.Flag&FlagTopFrame != 0; top != topFrame[name] {
					t.Errorf("%s: top frame %v, assembly says %v", name, top, topFrame[name])
				}
				if spWrite[name] {
					seenSP++
					if f.Flag&FlagSPWrite == 0 {
						t.Errorf("%s moves a value into SP but is not flagged as writing SP", name)
					}
				}
				if topFrame[name] {
					seenTop++
				}
			}
			if seenTop == 0 || seenSP == 0 {
				t.Errorf("no function of the oracle found: %d top frames, %d SP writers", seenTop, seenSP)
			}
		})
	}
}
