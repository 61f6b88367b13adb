package process

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// queryable reports whether this kernel answers PROCMAP_QUERY (6.11).
func queryable(t *testing.T) bool {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var major, minor int
	fields := strings.SplitN(unix.ByteSliceToString(u.Release[:]), ".", 3)
	if len(fields) >= 2 {
		major, _ = strconv.Atoi(fields[0])
		minor, _ = strconv.Atoi(fields[1])
	}
	return major > 6 || major == 6 && minor >= 11
}

// The kernel's answers to PROCMAP_QUERY are the executable lines of the
// maps text, read the same moment: for this process, with a deleted file
// whose name has a newline and " (x)" in it mapped executable, and for a
// child.
func TestQueryExecMappingsMatchesText(t *testing.T) {
	if _, err := os.Stat("/proc/self/maps"); err != nil {
		t.Skipf("no procfs: %v", err)
	}
	if !queryable(t) {
		t.Skip("PROCMAP_QUERY needs Linux 6.11")
	}
	path := filepath.Join(t.TempDir(), "code\nwith (x)")
	if err := os.WriteFile(path, make([]byte, 2*os.Getpagesize()), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	code, err := unix.Mmap(int(f.Fd()), int64(os.Getpagesize()), os.Getpagesize(), unix.PROT_READ|unix.PROT_EXEC, unix.MAP_PRIVATE)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Munmap(code) }()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}

	check := func(pid string) []Mapping {
		t.Helper()
		maps := filepath.Join("/proc", pid, "maps")
		qf, err := os.Open(maps)
		if err != nil {
			t.Fatal(err)
		}
		defer qf.Close()
		got, ok, err := queryExecMappings(qf)
		if !ok || err != nil {
			t.Fatalf("%s: queryExecMappings = %v, %v", maps, ok, err)
		}
		tf, err := os.Open(maps)
		if err != nil {
			t.Fatal(err)
		}
		defer tf.Close()
		all, err := ParseMaps(tf)
		if err != nil {
			t.Fatal(err)
		}
		var want []Mapping
		for _, m := range all {
			if m.Executable() && m.Path != "[vsyscall]" {
				want = append(want, m)
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: queried mappings differ from the text's executable ones (-text +query):\n%s", maps, diff)
		}
		return got
	}

	var deleted bool
	for _, m := range check("self") {
		if m.Deleted && strings.HasSuffix(m.Path, `code\012with (x)`) && m.Offset == uint64(os.Getpagesize()) {
			deleted = true
		}
	}
	if !deleted {
		t.Errorf("the deleted file mapped at offset %d is not among the queried mappings", os.Getpagesize())
	}
	child := startSleeper(t, buildSleeper(t), "query-worker")
	if ms := check(strconv.Itoa(child.pid)); len(ms) < 2 {
		t.Errorf("child: %d executable mappings, want its binary's and its libraries'", len(ms))
	}
}

// A file that is not a maps file (a fake procfs) is read as text.
func TestQueryExecMappingsFallsBack(t *testing.T) {
	p := filepath.Join(t.TempDir(), "maps")
	if err := os.WriteFile(p, []byte("400000-401000 r-xp 00000000 08:01 7 /bin/x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if ms, ok, err := queryExecMappings(f); ok || err != nil || ms != nil {
		t.Errorf("queryExecMappings(regular file) = %v, %v, %v; want nothing, not ok", ms, ok, err)
	}
	ms, err := readExecMappings(filepath.Dir(p))
	if err != nil || len(ms) != 1 || ms[0].Path != "/bin/x" {
		t.Errorf("readExecMappings = %+v, %v; want /bin/x from the text", ms, err)
	}
}
