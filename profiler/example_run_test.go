package profiler_test

import (
	"io"
	"os"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// TestExample runs Example, which has no Output comment because it needs
// privileges, and checks what it prints.
func TestExample(t *testing.T) {
	testutil.RequirePrivileges(t, "the profiler example")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	out := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		out <- string(b)
	}()
	func() {
		defer func() { os.Stdout = stdout }()
		Example()
	}()
	w.Close()
	got := <-out
	const want = `run: <nil>
intervals emitted: true
samples of this process: true
spin named: true
every sample counted: true
`
	if got != want {
		t.Errorf("Example printed:\n%s\nwant:\n%s", got, want)
	}
}
