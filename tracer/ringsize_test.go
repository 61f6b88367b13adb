package tracer

import "testing"

func TestRingBufferBytesFor(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hz     int
		cpus   int
		offCPU bool
		want   int
	}{
		{name: "default rate, small host", hz: 19, cpus: 2, want: 1 << 20}, // 78 KB of samples, 102 KB of snapshots
		{name: "default rate, 64 CPUs", hz: 19, cpus: 64, want: 8 << 20},   // 2.5 MB of samples, 3.3 MB of snapshots
		{name: "499 Hz, 2 CPUs", hz: 499, cpus: 2, want: 8 << 20},          // 2.0 MB of samples, 2.7 MB of snapshots
		{name: "1000 Hz, 2 CPUs", hz: 1000, cpus: 2, want: 16 << 20},       // 4.1 MB of samples, 5.4 MB of snapshots
		{name: "1000 Hz, 256 CPUs", hz: 1000, cpus: 256, want: 64 << 20},   // capped
		{name: "off-CPU on, small host", hz: 19, cpus: 2, offCPU: true, want: 4 << 20},
		{name: "nonsense inputs", hz: 0, cpus: 0, want: 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := RingBufferBytesFor(tc.hz, tc.cpus, tc.offCPU)
			if got != tc.want {
				t.Errorf("RingBufferBytesFor(%d, %d, %v) = %d, want %d", tc.hz, tc.cpus, tc.offCPU, got, tc.want)
			}
			if got&(got-1) != 0 || got%4096 != 0 {
				t.Errorf("%d is not a power of two and a page multiple", got)
			}
		})
	}
}
