package v8

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/internal/testutil"
)

func TestFind(t *testing.T) {
	testutil.RequireRoot(t, "reading a node process")
	for _, node := range nodes(t) {
		t.Run(node.name, func(t *testing.T) {
			out, err := exec.Command(node.path, "-p", "process.version + ' ' + process.versions.v8").Output()
			if err != nil {
				t.Fatal(err)
			}
			f := strings.Fields(string(out))
			wantNode, wantV8 := f[0], strings.SplitN(f[1], "-", 2)[0]
			cmd := startNode(t, node.path, "idle.js")
			vm, _ := findVM(t, cmd.Process.Pid)
			if vm.V8 != wantV8 || vm.Node != wantNode {
				t.Errorf("found v8 %s node %s, node says %s %s", vm.V8, vm.Node, wantV8, wantNode)
			}
			if !strings.HasPrefix(wantNode, "v"+strconv.Itoa(vm.NodeMajor)+".") {
				t.Errorf("node major %d, node says %s", vm.NodeMajor, wantNode)
			}
			k := vm.Kernel
			if len(k.Builtins) == 0 || k.FPFunction >= 0 || k.FPMarker >= 0 || k.JSFunctionShared == 0 || k.SmiShift != 32 {
				t.Errorf("kernel %+v", k)
			}
			// The binary's own mapping of the builtins is among the
			// ranges, named as its symbols say.
			for _, r := range k.Builtins {
				name, ok := vm.builtinAt(r.Start)
				if !ok || name == "" {
					t.Errorf("no builtin at the start of %+v", r)
				}
			}
		})
	}
}

func TestFindNotV8(t *testing.T) {
	procs := process.NewTable("/proc", zap.NewNop(), process.Options{})
	p, err := procs.Get(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	mem, err := python.OpenMem("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer testutil.Close(t, mem)
	if _, err := Find(p, mem); !errors.Is(err, ErrNotV8) {
		t.Errorf("find in the test binary: %v, want ErrNotV8", err)
	}
}

func TestLayoutUnknown(t *testing.T) {
	if _, err := newLayout(synthMetadata(), 9); !errors.Is(err, ErrUnknownVersion) {
		t.Errorf("v8 9: %v, want ErrUnknownVersion", err)
	}
	md := synthMetadata()
	delete(md, "class_Script__line_ends__Object")
	if _, err := newLayout(md, 11); !errors.Is(err, ErrUnknownVersion) {
		t.Errorf("no Script::line_ends: %v, want ErrUnknownVersion", err)
	}
	md = synthMetadata()
	delete(md, "off_fp_function")
	l, err := newLayout(md, 11)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.kernel(md); !errors.Is(err, ErrUnknownVersion) {
		t.Errorf("no function slot: %v, want ErrUnknownVersion", err)
	}
}
