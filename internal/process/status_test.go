package process

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseNSpid(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		want      []int
		wantFound bool
		wantErr   bool
	}{
		{name: "host process", in: statusText(4242, 1, "app"), want: []int{4242}, wantFound: true},
		{name: "container process", in: statusText(4242, 1, "app", 1), want: []int{4242, 1}, wantFound: true},
		{name: "nested containers", in: statusText(4242, 1, "app", 300, 7), want: []int{4242, 300, 7}, wantFound: true},
		{name: "last line without newline", in: "Name:\tx\nNSpid:\t5\t9", want: []int{5, 9}, wantFound: true},
		{name: "a Name that looks like NSpid is not it", in: "Name:\tNSpid:\t1\nNSpid:\t5\t9\n", want: []int{5, 9}, wantFound: true},
		{name: "old kernel without NSpid", in: "Name:\tx\nPid:\t5\n", wantFound: false},
		{name: "empty", in: "", wantFound: false},
		{name: "not a number", in: "NSpid:\t5\tx\n", wantFound: true, wantErr: true},
		{name: "zero", in: "NSpid:\t5\t0\n", wantFound: true, wantErr: true},
		{name: "negative", in: "NSpid:\t-5\n", wantFound: true, wantErr: true},
		{name: "no fields", in: "NSpid:\t\n", wantFound: true, wantErr: true},
		{name: "overflow", in: "NSpid:\t99999999999999999999999\n", wantFound: true, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, found, err := parseNSpid([]byte(tt.in))
			if (err != nil) != tt.wantErr || found != tt.wantFound {
				t.Fatalf("parseNSpid() = %v, %v, %v; want found %v, error %v", got, found, err, tt.wantFound, tt.wantErr)
			}
			if err != nil && !errors.Is(err, errStatusSyntax) {
				t.Errorf("error %v does not match errStatusSyntax", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("parseNSpid() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestParseNSpidSelf reads the test's own status: the first NSpid entry is
// the PID procfs shows, the last the PID the process sees for itself.
func TestParseNSpidSelf(t *testing.T) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no procfs: %v", err)
	}
	pids, found, err := parseNSpid(b)
	if err != nil || !found {
		t.Fatalf("parseNSpid(/proc/self/status) = %v, %v, %v", pids, found, err)
	}
	if pids[len(pids)-1] != os.Getpid() {
		t.Errorf("last NSpid = %d, want os.Getpid() %d", pids[len(pids)-1], os.Getpid())
	}
	self, err := os.Readlink("/proc/self")
	if err != nil {
		t.Fatal(err)
	}
	if strconv.Itoa(pids[0]) != self {
		t.Errorf("first NSpid = %d, want the PID procfs names /proc/self: %s", pids[0], self)
	}
}

func FuzzParseNSpid(f *testing.F) {
	f.Add([]byte(statusText(4242, 1, "app", 1)))
	f.Add([]byte("NSpid:\t5\tx\n"))
	f.Add([]byte("NSpid:"))
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		pids, found, err := parseNSpid(data)
		s := string(data)
		if hasLine := strings.HasPrefix(s, "NSpid:") || strings.Contains(s, "\nNSpid:"); found != hasLine {
			t.Fatalf("parseNSpid(%q) found = %v, but a line starts with NSpid: %v", data, found, hasLine)
		}
		if err == nil && found && len(pids) == 0 {
			t.Fatalf("parseNSpid(%q) found an NSpid line without PIDs and no error", data)
		}
		for _, p := range pids {
			if p <= 0 {
				t.Fatalf("parseNSpid(%q) = %v: a PID <= 0", data, pids)
			}
		}
		if err != nil && pids != nil {
			t.Fatalf("parseNSpid(%q) = %v with error %v", data, pids, err)
		}
	})
}
