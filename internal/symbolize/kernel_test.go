package symbolize

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sonde-dev/sonde/internal/testutil"
)

const sampleKallsyms = `ffffffff81000000 T _stext
ffffffff81000000 T _text
ffffffff81000100 t do_one_initcall
ffffffff81000200 D some_data
ffffffff81000300 W weak_func
ffffffff81000400 r read_only
ffffffffc0a01000 t nft_do_chain	[nf_tables]
ffffffffc0a02000 T nft_register_expr	[nf_tables]
ffffffffc0900000 t xt_match	[x_tables]
ffffffff81000500 w weak_local
`

func TestParseKallsyms(t *testing.T) {
	k, err := parseKallsyms(strings.NewReader(sampleKallsyms))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		addr   uint64
		want   Symbol
		wantOK bool
	}{
		{"below the first symbol", 0xffffffff80ffffff, Symbol{}, false},
		{"first of two aliases", 0xffffffff81000000, Symbol{Name: "_stext", Addr: 0xffffffff81000000}, true},
		{"inside", 0xffffffff810000ff, Symbol{Name: "_stext", Addr: 0xffffffff81000000}, true},
		{"local text", 0xffffffff81000101, Symbol{Name: "do_one_initcall", Addr: 0xffffffff81000100}, true},
		{"data symbols are skipped", 0xffffffff81000201, Symbol{Name: "do_one_initcall", Addr: 0xffffffff81000100}, true},
		{"weak", 0xffffffff81000300, Symbol{Name: "weak_func", Addr: 0xffffffff81000300}, true},
		{"lower-case weak", 0xffffffff81000501, Symbol{Name: "weak_local", Addr: 0xffffffff81000500}, true},
		{"module listed out of order", 0xffffffffc0900010, Symbol{Name: "xt_match", Module: "x_tables", Addr: 0xffffffffc0900000}, true},
		{"module", 0xffffffffc0a01001, Symbol{Name: "nft_do_chain", Module: "nf_tables", Addr: 0xffffffffc0a01000}, true},
		{"last symbol", 0xffffffffc0a02fff, Symbol{Name: "nft_register_expr", Module: "nf_tables", Addr: 0xffffffffc0a02000}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := k.Lookup(tt.addr)
			if ok != tt.wantOK {
				t.Fatalf("Lookup(%#x) ok = %v, want %v", tt.addr, ok, tt.wantOK)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Lookup(%#x) (-want +got):\n%s", tt.addr, diff)
			}
		})
	}
	if k.Len() != 7 {
		t.Errorf("Len() = %d, want 7 distinct text addresses", k.Len())
	}
}

func TestParseKallsymsErrors(t *testing.T) {
	tests := []struct {
		name        string
		input       string
		wantErr     error // nil: any error
		wantOK      bool
		wantSkipped int
	}{
		{name: "hidden addresses", input: "0000000000000000 T _stext\n0000000000000000 t foo\t[mod]\n", wantErr: ErrKernelAddressesHidden},
		{name: "empty", input: ""},
		{name: "only data", input: "ffffffff81000000 D x\n"},
		{name: "malformed lines skipped", input: "garbage\nffffffff8100zz00 T bad\nffffffff81000000 T good\nffffffff81000010 T\nffffffff81000020 T two words\nffffffff81000030 t m\t[unterminated\n", wantOK: true, wantSkipped: 5},
		{name: "overlong line skipped", input: "ffffffff81000000 T " + strings.Repeat("x", 70000) + "\nffffffff81000100 T ok\n", wantOK: true, wantSkipped: 1},
		{name: "no final newline", input: "ffffffff81000000 T ok", wantOK: true},
		{name: "address too long", input: "1ffffffff81000000 T x\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := parseKallsyms(strings.NewReader(tt.input))
			if tt.wantOK {
				if err != nil {
					t.Fatal(err)
				}
				if k.Skipped() != tt.wantSkipped {
					t.Errorf("Skipped() = %d, want %d", k.Skipped(), tt.wantSkipped)
				}
				if _, ok := k.Lookup(^uint64(0)); !ok {
					t.Error("no symbol found at the top of the address space")
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestLoadKernelHidden(t *testing.T) {
	p := filepath.Join(t.TempDir(), "kallsyms")
	if err := os.WriteFile(p, []byte("0000000000000000 T _stext\n0000000000000000 T _text\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKernel(p); !errors.Is(err, ErrKernelAddressesHidden) {
		t.Errorf("LoadKernel error = %v, want ErrKernelAddressesHidden", err)
	}
	s := New(nil, Options{KallsymsPath: p})
	if _, err := s.Kernel(); !errors.Is(err, ErrKernelAddressesHidden) {
		t.Errorf("Symbolizer.Kernel error = %v, want ErrKernelAddressesHidden", err)
	}

	// The real file: either it loads, or the kernel hides addresses from us.
	if testutil.MissingCapabilities() == nil {
		return // TestKernelOracle covers the privileged case
	}
	if _, err := LoadKernel("/proc/kallsyms"); err != nil && !errors.Is(err, ErrKernelAddressesHidden) {
		t.Errorf("LoadKernel(/proc/kallsyms) unprivileged: %v, want success or ErrKernelAddressesHidden", err)
	}
}

// kallsymsEntry is one text symbol as the test reads /proc/kallsyms itself.
type kallsymsEntry struct {
	addr         uint64
	name, module string
}

func readKallsymsOracle(t *testing.T, path string) []kallsymsEntry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []kallsymsEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 || !strings.ContainsAny(fields[1], "tTwW") || len(fields[1]) != 1 {
			continue
		}
		addr, err := strconv.ParseUint(fields[0], 16, 64)
		if err != nil {
			t.Fatalf("kallsyms line %q: %v", sc.Text(), err)
		}
		e := kallsymsEntry{addr: addr, name: fields[2]}
		if len(fields) > 3 {
			e.module = strings.Trim(fields[3], "[]")
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestKernelOracle(t *testing.T) {
	testutil.RequirePrivileges(t, "reading kernel symbol addresses")
	// One snapshot for both readers: kallsyms changes whenever a BPF
	// program is loaded or unloaded, as other packages' tests do meanwhile.
	data, err := os.ReadFile("/proc/kallsyms")
	if err != nil {
		t.Fatal(err)
	}
	snapshot := filepath.Join(t.TempDir(), "kallsyms")
	if err := os.WriteFile(snapshot, data, 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := LoadKernel(snapshot)
	if err != nil {
		t.Fatal(err)
	}
	entries := readKallsymsOracle(t, snapshot)
	slices.SortStableFunc(entries, func(a, b kallsymsEntry) int { return cmpUint(a.addr, b.addr) })
	byAddr := map[uint64][]kallsymsEntry{}
	var addrs []uint64
	for _, e := range entries {
		if _, ok := byAddr[e.addr]; !ok {
			addrs = append(addrs, e.addr)
		}
		byAddr[e.addr] = append(byAddr[e.addr], e)
	}
	if k.Len() != len(addrs) {
		t.Errorf("Len() = %d, the oracle has %d distinct text addresses", k.Len(), len(addrs))
	}
	checked := 0
	for i := 0; i < len(addrs); i += 53 {
		a := addrs[i]
		probe := a + 1
		if i+1 < len(addrs) && addrs[i+1] == probe {
			probe = a // the next symbol starts one byte later
		}
		got, ok := k.Lookup(probe)
		if !ok {
			t.Errorf("Lookup(%#x) found nothing", probe)
			continue
		}
		if got.Addr != a || !slices.ContainsFunc(byAddr[a], func(e kallsymsEntry) bool { return e.name == got.Name && e.module == got.Module }) {
			t.Errorf("Lookup(%#x) = %+v, want one of %+v", probe, got, byAddr[a])
		}
		checked++
	}
	t.Logf("checked %d of %d addresses", checked, len(addrs))
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// TestParseKallsymsBuildsOutsideTheHeap parses a kallsyms of 200k text
// symbols, a big distribution kernel's, and checks the heap took a small
// part of the 3.2 MB its symbols take: they gather outside it.
func TestParseKallsymsBuildsOutsideTheHeap(t *testing.T) {
	const n = 200_000
	var b strings.Builder
	last := -1 // the line whose address is the highest
	for i := range n {
		// Out of order in blocks, as modules are, so the sort moves rows.
		slot := (i * 7919) % n
		if slot == n-1 {
			last = i
		}
		addr := 0xffffffff81000000 + uint64(slot)*0x40
		b.WriteString(strconv.FormatUint(addr, 16))
		b.WriteString(" t func_")
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	text := b.String()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	k, err := parseKallsyms(strings.NewReader(text))
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if k.Len() != n {
		t.Fatalf("Len() = %d, want %d", k.Len(), n)
	}
	const rows = n * 16
	if got := after.TotalAlloc - before.TotalAlloc; got > rows/8 {
		t.Errorf("parsing allocated %d heap bytes; its %d bytes of symbols belong outside the heap", got, rows)
	}
	s, ok := k.Lookup(0xffffffff81000000 + 0x40*uint64(n-1) + 1)
	if want := "func_" + strconv.Itoa(last); !ok || s.Name != want {
		t.Errorf("Lookup of the last address = %q, %v; want %q", s.Name, ok, want)
	}
}
