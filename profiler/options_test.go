package profiler

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sonde-dev/sonde/internal/testutil"
)

func TestDefaultOptionsValid(t *testing.T) {
	o := DefaultOptions()
	if err := o.Validate(); err != nil {
		t.Errorf("DefaultOptions().Validate() = %v", err)
	}
}

// Validate reports every problem, each a *FieldError naming the option;
// ValidateNamed names them the caller's way.
func TestValidateJoinsEveryProblem(t *testing.T) {
	o := DefaultOptions()
	o.SamplesPerSecond = 0
	o.ProcFS = "proc"
	o.IncludeEnvVars = []string{"A", "A"}
	o.Filters.Containers = "some"
	o.DebugDirs = []string{"/usr/lib/debug", "dbg"}
	o.RingBufferBytes = 1000
	err := o.Validate()
	var fields []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("%v is not a *FieldError", e)
		}
		fields = append(fields, fe.Field)
	}
	want := []string{"SamplesPerSecond", "ProcFS", "IncludeEnvVars[1]", "Filters.Containers", "DebugDirs[1]",
		"RingBufferBytes", "RingBufferBytes"}
	if diff := cmp.Diff(want, fields); diff != "" {
		t.Errorf("fields (-want +got):\n%s", diff)
	}
	named := o.ValidateNamed(strings.ToLower).Error()
	if !strings.Contains(named, `includeenvvars[1]: "A" is already listed at includeenvvars[0]`) {
		t.Errorf("ValidateNamed(strings.ToLower) = %q, want the duplicate named in lower case twice", named)
	}
}

// New refuses a procfs that is not one, before it loads anything: no
// privileges needed.
func TestNewRefusesNotAProcFS(t *testing.T) {
	for _, root := range []string{"/nonexistent/proc", t.TempDir(), fakeProcFS(t)} {
		o := DefaultOptions()
		o.ProcFS = root
		p, err := New(o)
		if err == nil {
			testutil.Close(t, p)
			t.Fatalf("New with procfs %s: no error", root)
		}
		if !strings.Contains(err.Error(), "procfs "+root+" is not a mounted procfs") {
			t.Errorf("New with procfs %s: %v, want it named as not a procfs", root, err)
		}
	}
}

// fakeProcFS returns a plain directory that holds what a procfs has at
// first sight: self/stat and self/maps, empty.
func fakeProcFS(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"self/stat", "self/maps"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}
