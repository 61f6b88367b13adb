package profile

import (
	"testing"
	"time"
)

// fuzzInput hands out the bytes of a fuzz input; past the end it yields 0.
type fuzzInput struct{ data []byte }

func (in *fuzzInput) byte() byte {
	if len(in.data) == 0 {
		return 0
	}
	c := in.data[0]
	in.data = in.data[1:]
	return c
}

func (in *fuzzInput) intn(n int) int { return int(in.byte()) % n }

// str returns a string of up to 7 bytes taken from the input.
func (in *fuzzInput) str() string {
	n := min(in.intn(8), len(in.data))
	s := string(in.data[:n])
	in.data = in.data[n:]
	return s
}

// FuzzBuilder drives the builder with samples drawn from small pools mixed
// with arbitrary strings, addresses that collide on purpose, caps that bite,
// and two intervals, and checks every output against validate,
// checkDeduplicated and the naive oracle.
func FuzzBuilder(f *testing.F) {
	f.Add([]byte{19, 10, 5, 3, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{0, 0, 0, 0, 1, 2, 'a', 'b', 3, 4, 5, 2, 1, 0, 2, 3, 'x', 'y', 'z', 0, 1, 1, 1})
	f.Add([]byte("\x01\x03\x02\x07some random stack bytes with strings in them\x00\xff\xfe\x10"))
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &fuzzInput{data: data}
		opts := Options{
			SamplesPerSecond: in.intn(200),
			ScopeVersion:     in.str(),
			MaxSamples:       in.intn(64),
			MaxFrames:        in.intn(12),
		}
		split := in.intn(32)

		resources := []*Resource{
			nil,
			{PID: 1, ExecutableName: "a"},
			{PID: 1, ExecutableName: "a"},
			{PID: 1, ExecutableName: "a", EnvVars: map[string]string{}},
			{PID: 2, ExecutableName: in.str(), ContainerID: in.str(), EnvVars: map[string]string{in.str(): in.str()}},
			{PID: 2, ServiceName: in.str(), EnvVars: map[string]string{"X": in.str(), in.str(): ""}},
			{PID: 2, ServiceName: in.str(), CommandLine: in.str(), NamespacePID: int64(in.intn(3))},
			{PID: 2, CommandLine: in.str(), NamespacePID: int64(in.intn(3))},
		}
		mappings := []*Mapping{
			nil,
			{},
			{Start: 0, Limit: 8, File: "/a", GNUBuildID: in.str()},
			{Start: 0, Limit: 8, File: "/a", GNUBuildID: in.str()},
			{Start: 0, Limit: 8, File: in.str(), GoBuildID: in.str(), FileID: in.str()},
		}
		strs := []string{"", "f", "g", in.str(), in.str()}
		pick := func() string { return strs[in.intn(len(strs))] }

		var samples []Sample
		for len(in.data) > 0 && len(samples) < 128 {
			s := Sample{
				Kind:       Kind(in.intn(3)),
				Resource:   resources[in.intn(len(resources))],
				TID:        int64(in.intn(3)),
				ThreadName: pick(),
				CPU:        int64(in.intn(2)),
				Time:       testStart.Add(time.Duration(len(samples)) * time.Millisecond),
				Value:      int64(in.intn(3)),
			}
			for range in.intn(16) {
				fr := Frame{Type: FrameType(in.intn(5)), Address: uint64(in.intn(4)), Mapping: mappings[in.intn(len(mappings))], FramePointer: in.intn(2) == 1}
				for range in.intn(3) {
					fr.Lines = append(fr.Lines, Line{Function: pick(), SystemName: pick(), File: pick(), Line: int64(in.intn(3))})
				}
				s.Frames = append(s.Frames, fr)
			}
			samples = append(samples, s)
		}

		b := NewBuilder(opts)
		split = min(split, len(samples))
		for _, part := range [][]Sample{samples[:split], samples[split:]} {
			for _, s := range part {
				b.Add(s)
			}
			p := b.Flush(testStart, testEnd)
			if err := validate(p); err != nil {
				t.Fatalf("validate: %v", err)
			}
			if err := checkDeduplicated(p); err != nil {
				t.Fatalf("deduplication: %v", err)
			}
			if diff := diffDecoded(expect(opts, part, testStart, testEnd), decode(p)); diff != "" {
				t.Fatalf("decoded (-want +got):\n%s", diff)
			}
		}
	})
}
