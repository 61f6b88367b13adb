package jvm

import "testing"

// A compiled frame past its last safepoint is placed on its method's one
// line only when all its bytecodes are on that line.
func TestMethodOnlyLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    method
		want int64
	}{
		{"one line", method{lines: []linePair{{0, 28}, {4, 28}}}, 28},
		{"single pair", method{lines: []linePair{{0, 40}}}, 40},
		{"two lines", method{lines: []linePair{{0, 28}, {4, 29}}}, 0},
		{"no table", method{}, 0},
		{"native", method{native: true, lines: []linePair{{0, 7}}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.m.onlyLine(); got != tc.want {
				t.Errorf("onlyLine = %d, want %d", got, tc.want)
			}
		})
	}
}
