package profile

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/google/go-cmp/cmp"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"
)

// validate is Check, the conformance checker the pipeline's tests use too.
func validate(p pprofile.Profiles) error { return Check(p) }

// checkDeduplicated is CheckDeduplicated.
func checkDeduplicated(p pprofile.Profiles) error { return CheckDeduplicated(p) }

// The decoded form of a Profiles: every index resolved through the
// dictionary. Tests compare it with what the input samples imply.
type (
	dResource struct {
		Attrs    map[string]any
		Scope    string
		Version  string
		Profiles []dProfile
	}
	dProfile struct {
		SampleType, SampleUnit string
		PeriodType, PeriodUnit string
		Period                 int64
		Time, Duration         uint64
		Samples                []dSample
	}
	dSample struct {
		Attrs  map[string]any
		Frames []dFrame // leaf first
		Values []int64
		Times  []uint64
	}
	dFrame struct {
		Attrs   map[string]any
		Address uint64
		Mapping dMapping
		Lines   []Line
	}
	dMapping struct {
		Start, Limit, Offset uint64
		File                 string
		Attrs                map[string]any
	}
)

// decode resolves p into its decoded form. It assumes validate(p) == nil.
func decode(p pprofile.Profiles) []dResource {
	d := p.Dictionary()
	str := func(i int32) string { return d.StringTable().At(int(i)) }
	attrs := func(s pcommon.Int32Slice) map[string]any {
		if s.Len() == 0 {
			return nil
		}
		m := make(map[string]any, s.Len())
		for _, i := range s.All() {
			a := d.AttributeTable().At(int(i))
			m[str(a.KeyStrindex())] = a.Value().AsRaw()
		}
		return m
	}
	frame := func(li int32) dFrame {
		l := d.LocationTable().At(int(li))
		m := d.MappingTable().At(int(l.MappingIndex()))
		f := dFrame{
			Attrs:   attrs(l.AttributeIndices()),
			Address: l.Address(),
			Mapping: dMapping{
				Start: m.MemoryStart(), Limit: m.MemoryLimit(), Offset: m.FileOffset(),
				File: str(m.FilenameStrindex()), Attrs: attrs(m.AttributeIndices()),
			},
		}
		for _, ln := range l.Lines().All() {
			fn := d.FunctionTable().At(int(ln.FunctionIndex()))
			f.Lines = append(f.Lines, Line{
				Function: str(fn.NameStrindex()), SystemName: str(fn.SystemNameStrindex()),
				File: str(fn.FilenameStrindex()), Line: ln.Line(),
			})
		}
		return f
	}

	var out []dResource
	for _, rp := range p.ResourceProfiles().All() {
		for _, sp := range rp.ScopeProfiles().All() {
			r := dResource{Attrs: rp.Resource().Attributes().AsRaw(), Scope: sp.Scope().Name(), Version: sp.Scope().Version()}
			for _, prof := range sp.Profiles().All() {
				dp := dProfile{
					SampleType: str(prof.SampleType().TypeStrindex()), SampleUnit: str(prof.SampleType().UnitStrindex()),
					PeriodType: str(prof.PeriodType().TypeStrindex()), PeriodUnit: str(prof.PeriodType().UnitStrindex()),
					Period: prof.Period(), Time: uint64(prof.Time()), Duration: prof.DurationNano(),
				}
				for _, s := range prof.Samples().All() {
					ds := dSample{
						Attrs:  attrs(s.AttributeIndices()),
						Values: s.Values().AsRaw(),
						Times:  s.TimestampsUnixNano().AsRaw(),
					}
					for _, li := range d.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
						ds.Frames = append(ds.Frames, frame(li))
					}
					dp.Samples = append(dp.Samples, ds)
				}
				r.Profiles = append(r.Profiles, dp)
			}
			out = append(out, r)
		}
	}
	return out
}

// diffDecoded returns "" when want and got are equal up to nil versus empty
// slices and maps, else a report labelled (-want +got) of the first
// difference. Comparing with reflect.DeepEqual after normalizing, and running
// cmp.Diff only on the first differing sample or header, keeps large
// comparisons fast even when they fail.
func diffDecoded(want, got []dResource) string {
	w, g := normalize(want), normalize(got)
	if reflect.DeepEqual(w, g) {
		return ""
	}
	for i := range min(len(w), len(g)) {
		if reflect.DeepEqual(w[i], g[i]) {
			continue
		}
		for j := range min(len(w[i].Profiles), len(g[i].Profiles)) {
			ws, gs := w[i].Profiles[j].Samples, g[i].Profiles[j].Samples
			for k := range min(len(ws), len(gs)) {
				if !reflect.DeepEqual(ws[k], gs[k]) {
					return fmt.Sprintf("resource %d %v, profile %d, sample %d (-want +got):\n%s",
						i, w[i].Attrs, j, k, cmp.Diff(ws[k], gs[k]))
				}
			}
		}
		return fmt.Sprintf("resource %d (-want +got), samples counted:\n%s", i, cmp.Diff(headers(w[i]), headers(g[i])))
	}
	var wa, ga []map[string]any
	for _, r := range w {
		wa = append(wa, r.Attrs)
	}
	for _, r := range g {
		ga = append(ga, r.Attrs)
	}
	return fmt.Sprintf("resources (-want +got):\n%s", cmp.Diff(wa, ga))
}

// headers returns r with each profile's samples replaced by their count.
func headers(r dResource) any {
	// Named, not embedded: cmp cannot look into an embedded unexported type.
	type header struct {
		Profile    dProfile
		NumSamples int
	}
	var hs []header
	for _, p := range r.Profiles {
		n := len(p.Samples)
		p.Samples = nil
		hs = append(hs, header{p, n})
	}
	return struct {
		Attrs          map[string]any
		Scope, Version string
		ProfileHeaders []header
	}{r.Attrs, r.Scope, r.Version, hs}
}

// normalize returns a deep copy of rs in which empty slices and maps are nil.
func normalize(rs []dResource) []dResource {
	nilIfEmpty := func(m map[string]any) map[string]any {
		if len(m) == 0 {
			return nil
		}
		return m
	}
	var out []dResource
	for _, r := range rs {
		r.Attrs = nilIfEmpty(r.Attrs)
		var profs []dProfile
		for _, p := range r.Profiles {
			var samples []dSample
			for _, s := range p.Samples {
				s.Attrs = nilIfEmpty(s.Attrs)
				s.Values = slices.Clip(append([]int64(nil), s.Values...))
				s.Times = slices.Clip(append([]uint64(nil), s.Times...))
				var frames []dFrame
				for _, f := range s.Frames {
					f.Attrs = nilIfEmpty(f.Attrs)
					f.Mapping.Attrs = nilIfEmpty(f.Mapping.Attrs)
					f.Lines = append([]Line(nil), f.Lines...)
					frames = append(frames, f)
				}
				s.Frames = frames
				samples = append(samples, s)
			}
			p.Samples = samples
			profs = append(profs, p)
		}
		r.Profiles = profs
		out = append(out, r)
	}
	return out
}
