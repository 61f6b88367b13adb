package testutil

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// StatusKiB returns a field of /proc/self/status given in KiB, such as
// RssFile or RssAnon.
func StatusKiB(t testing.TB, field string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				if kb, err := strconv.Atoi(f[0]); err == nil {
					return kb
				}
			}
			break
		}
	}
	t.Fatalf("no %s in KiB in /proc/self/status", field)
	return 0
}
