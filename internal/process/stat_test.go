package process

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// statLine renders a /proc/PID/stat line with the fields the parser reads and
// plausible values elsewhere.
func statLine(pid int, comm string, state byte, ppid int, flags, start uint64) string {
	return fmt.Sprintf("%d (%s) %c %d %d %d 0 -1 %d 100 0 0 0 3 1 0 0 20 0 1 0 %d 3133440 377 "+
		"18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
		pid, comm, state, ppid, pid, pid, flags, start)
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    procStat
		wantErr bool
	}{
		{
			name: "plain",
			in:   "8776 (cat) R 8772 8772 3815 0 -1 4194304 100 0 0 0 0 0 0 0 20 0 1 0 28181 3133440 377 18446744073709551615 93849063022592 0\n",
			want: procStat{PID: 8776, Comm: "cat", State: 'R', PPID: 8772, Flags: 4194304, StartTime: 28181},
		},
		{
			name: "kernel thread",
			in:   "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 22 0 0 18446744073709551615 0 0\n",
			want: procStat{PID: 2, Comm: "kthreadd", State: 'S', Flags: 2129984, StartTime: 22},
		},
		{
			name: "comm with spaces and parentheses",
			in:   statLine(42, "a) b (c) Z 1 2", 'S', 7, 0, 99),
			want: procStat{PID: 42, Comm: "a) b (c) Z 1 2", State: 'S', PPID: 7, StartTime: 99},
		},
		{
			name: "comm with newline",
			in:   statLine(43, "x\ny", 'Z', 1, 4, 100),
			want: procStat{PID: 43, Comm: "x\ny", State: 'Z', PPID: 1, Flags: 4, StartTime: 100},
		},
		{
			name: "empty comm",
			in:   statLine(44, "", 'S', 1, 0, 5),
			want: procStat{PID: 44, State: 'S', PPID: 1, StartTime: 5},
		},
		{name: "empty", in: "", wantErr: true},
		{name: "no parentheses", in: "1 init S 0 0 0", wantErr: true},
		{name: "no pid", in: "(init) S 0", wantErr: true},
		{name: "bad pid", in: "x (init) S 0", wantErr: true},
		{name: "truncated", in: "1 (init) S 0 1 1 0 -1 4194560 0", wantErr: true},
		{name: "two-letter state", in: strings.Replace(statLine(1, "init", 'S', 0, 0, 1), " S ", " SS ", 1), wantErr: true},
		{name: "bad start time", in: "1 (init) S 0 0 0 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 -5 0", wantErr: true},
		{name: "bad flags", in: "1 (init) S 0 0 0 0 -1 x 0 0 0 0 0 0 0 0 20 0 1 0 5 0", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat([]byte(tt.in))
			if tt.wantErr {
				if err == nil {
					t.Fatalf("parseStat() = %+v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseStat() error = %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("parseStat() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestParseStatSelf checks the parser on the kernel's output against what the
// Go runtime knows about this process.
func TestParseStatSelf(t *testing.T) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skipf("no procfs: %v", err)
	}
	got, err := parseStat(b)
	if err != nil {
		t.Fatalf("parseStat(%q): %v", b, err)
	}
	if got.PID != os.Getpid() || got.PPID != os.Getppid() || got.kernelThread() || got.dead() || got.StartTime == 0 {
		t.Errorf("parseStat(/proc/self/stat) = %+v, want pid %d ppid %d, a live user process", got, os.Getpid(), os.Getppid())
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte(statLine(42, "a) b (c) Z 1 2", 'S', 7, 0, 99)))
	f.Add([]byte("2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 22 0 0 18446744073709551615 0 0\n"))
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 0"))
	f.Add([]byte("(()))"))
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := parseStat(in)
		if err != nil {
			return
		}
		if s.PID < 0 || s.PPID < 0 || len(s.Comm) > len(in) {
			t.Fatalf("parseStat(%q) = %+v", in, s)
		}
	})
}
