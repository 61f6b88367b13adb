package testutil

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// VDSOFunc is a function symbol of the vDSO image, as readelf lists it.
type VDSOFunc struct {
	Name        string // without its @version
	Value, Size uint64
}

// VDSO writes this process's vDSO image (the kernel maps the same one into
// every 64-bit process) to a file and lists its function symbols with
// readelf --dyn-syms: an oracle independent of Sonde's own ELF reading.
func VDSO(tb testing.TB) (path string, funcs []VDSOFunc) {
	tb.Helper()
	maps, err := os.Open("/proc/self/maps")
	if err != nil {
		tb.Fatal(err)
	}
	defer maps.Close()
	var start, end uint64
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 6 && f[5] == "[vdso]" {
			lo, hi, _ := strings.Cut(f[0], "-")
			start, _ = strconv.ParseUint(lo, 16, 64)
			end, _ = strconv.ParseUint(hi, 16, 64)
		}
	}
	if end <= start {
		tb.Fatal("no [vdso] mapping in /proc/self/maps")
	}
	mem, err := os.Open("/proc/self/mem")
	if err != nil {
		tb.Fatal(err)
	}
	defer mem.Close()
	img := make([]byte, end-start)
	if _, err := mem.ReadAt(img, int64(start)); err != nil {
		tb.Fatalf("read the vdso: %v", err)
	}
	path = filepath.Join(tb.TempDir(), "vdso.so")
	if err := os.WriteFile(path, img, 0o600); err != nil {
		tb.Fatal(err)
	}
	out, err := exec.Command(RequireTool(tb, "readelf"), "--dyn-syms", "-W", path).Output()
	if err != nil {
		tb.Fatalf("readelf --dyn-syms %s: %v", path, err)
	}
	// Num: Value Size Type Bind Vis Ndx Name[@version]
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || f[3] != "FUNC" || f[6] == "UND" {
			continue
		}
		value, err1 := strconv.ParseUint(f[1], 16, 64)
		size, err2 := strconv.ParseUint(f[2], 0, 64)
		if err1 != nil || err2 != nil || size == 0 {
			continue
		}
		name, _, _ := strings.Cut(f[7], "@")
		funcs = append(funcs, VDSOFunc{Name: name, Value: value, Size: size})
	}
	if len(funcs) == 0 {
		tb.Fatalf("readelf found no functions in the vdso:\n%s", out)
	}
	return path, funcs
}
