package pprofexporter

import (
	"bytes"
	"testing"

	pprof "github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/pdata/pprofile"
)

// FuzzConvert feeds OTLP profiles from hostile bytes (what a pipeline fed by
// an OTLP receiver may carry) through the conversion, the pprof encoder, the
// folded writer, the summary and the readable stacks: none may panic, and every profile written
// must parse back.
func FuzzConvert(f *testing.F) {
	var m pprofile.ProtoMarshaler
	seed, err := m.MarshalProfiles(build(fixture()))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte{})
	var um pprofile.ProtoUnmarshaler
	f.Fuzz(func(t *testing.T, data []byte) {
		pd, err := um.UnmarshalProfiles(data)
		if err != nil {
			return
		}
		for _, split := range []SplitBy{SplitNone, SplitService} {
			groups, _ := convert(pd, split)
			for _, g := range groups {
				var buf bytes.Buffer
				if err := g.prof.Write(&buf); err != nil {
					t.Fatalf("encode: %v", err)
				}
				if _, err := pprof.Parse(&buf); err != nil {
					t.Fatalf("the profile written does not parse back: %v", err)
				}
				if err := writeFolded(&bytes.Buffer{}, g.prof); err != nil {
					t.Fatalf("folded: %v", err)
				}
			}
			_ = formatTop(topFunctions(groups), 5)
		}
		_ = formatStacks(heaviestStacks(pd), 5)
	})
}
