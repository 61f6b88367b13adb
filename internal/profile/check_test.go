package profile

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/google/go-cmp/cmp"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"
)

// validate checks that every index of p is in range of its dictionary table,
// that index 0 of every table is the empty value, and that each sample pairs
// values and timestamps one to one. It returns every problem found.
func validate(p pprofile.Profiles) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	d := p.Dictionary()
	nStr, nAttr := d.StringTable().Len(), d.AttributeTable().Len()
	nFn, nLoc, nMap := d.FunctionTable().Len(), d.LocationTable().Len(), d.MappingTable().Len()
	nStack, nLink := d.StackTable().Len(), d.LinkTable().Len()
	in := func(what string, i int32, n int) {
		if i < 0 || int(i) >= n {
			bad("%s: index %d out of range [0,%d)", what, i, n)
		}
	}
	inAll := func(what string, s pcommon.Int32Slice, n int) {
		for j, i := range s.All() {
			in(fmt.Sprintf("%s[%d]", what, j), i, n)
		}
	}

	for name, n := range map[string]int{
		"string": nStr, "attribute": nAttr, "function": nFn, "location": nLoc,
		"mapping": nMap, "stack": nStack, "link": nLink,
	} {
		if n == 0 {
			bad("%s table is empty: index 0 must hold the empty value", name)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}

	// Index 0 of every table is the empty value.
	if s := d.StringTable().At(0); s != "" {
		bad("string_table[0] = %q", s)
	}
	if a := d.AttributeTable().At(0); a.KeyStrindex() != 0 || a.UnitStrindex() != 0 || a.Value().Type() != pcommon.ValueTypeEmpty {
		bad("attribute_table[0] is not empty")
	}
	if f := d.FunctionTable().At(0); f.NameStrindex() != 0 || f.SystemNameStrindex() != 0 || f.FilenameStrindex() != 0 || f.StartLine() != 0 {
		bad("function_table[0] is not empty")
	}
	if l := d.LocationTable().At(0); l.MappingIndex() != 0 || l.Address() != 0 || l.Lines().Len() != 0 || l.AttributeIndices().Len() != 0 {
		bad("location_table[0] is not empty")
	}
	if m := d.MappingTable().At(0); m.MemoryStart() != 0 || m.MemoryLimit() != 0 || m.FileOffset() != 0 || m.FilenameStrindex() != 0 || m.AttributeIndices().Len() != 0 {
		bad("mapping_table[0] is not empty")
	}
	if s := d.StackTable().At(0); s.LocationIndices().Len() != 0 {
		bad("stack_table[0] is not empty")
	}
	if l := d.LinkTable().At(0); !l.TraceID().IsEmpty() || !l.SpanID().IsEmpty() {
		bad("link_table[0] is not empty")
	}

	for i, a := range d.AttributeTable().All() {
		in(fmt.Sprintf("attribute_table[%d].key", i), a.KeyStrindex(), nStr)
		in(fmt.Sprintf("attribute_table[%d].unit", i), a.UnitStrindex(), nStr)
	}
	for i, f := range d.FunctionTable().All() {
		in(fmt.Sprintf("function_table[%d].name", i), f.NameStrindex(), nStr)
		in(fmt.Sprintf("function_table[%d].system_name", i), f.SystemNameStrindex(), nStr)
		in(fmt.Sprintf("function_table[%d].filename", i), f.FilenameStrindex(), nStr)
	}
	for i, m := range d.MappingTable().All() {
		in(fmt.Sprintf("mapping_table[%d].filename", i), m.FilenameStrindex(), nStr)
		inAll(fmt.Sprintf("mapping_table[%d].attributes", i), m.AttributeIndices(), nAttr)
	}
	for i, l := range d.LocationTable().All() {
		in(fmt.Sprintf("location_table[%d].mapping", i), l.MappingIndex(), nMap)
		inAll(fmt.Sprintf("location_table[%d].attributes", i), l.AttributeIndices(), nAttr)
		for j, ln := range l.Lines().All() {
			in(fmt.Sprintf("location_table[%d].line[%d].function", i, j), ln.FunctionIndex(), nFn)
		}
	}
	for i, s := range d.StackTable().All() {
		inAll(fmt.Sprintf("stack_table[%d].locations", i), s.LocationIndices(), nLoc)
	}

	for ri, rp := range p.ResourceProfiles().All() {
		for si, sp := range rp.ScopeProfiles().All() {
			for pi, prof := range sp.Profiles().All() {
				at := fmt.Sprintf("resource[%d].scope[%d].profile[%d]", ri, si, pi)
				in(at+".sample_type.type", prof.SampleType().TypeStrindex(), nStr)
				in(at+".sample_type.unit", prof.SampleType().UnitStrindex(), nStr)
				in(at+".period_type.type", prof.PeriodType().TypeStrindex(), nStr)
				in(at+".period_type.unit", prof.PeriodType().UnitStrindex(), nStr)
				inAll(at+".attributes", prof.AttributeIndices(), nAttr)
				for i, s := range prof.Samples().All() {
					sat := fmt.Sprintf("%s.sample[%d]", at, i)
					in(sat+".stack", s.StackIndex(), nStack)
					in(sat+".link", s.LinkIndex(), nLink)
					inAll(sat+".attributes", s.AttributeIndices(), nAttr)
					nv, nt := s.Values().Len(), s.TimestampsUnixNano().Len()
					if nv == 0 && nt == 0 {
						bad("%s has neither values nor timestamps", sat)
					}
					if nv != 0 && nt != 0 && nv != nt {
						bad("%s has %d values but %d timestamps", sat, nv, nt)
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

// checkDeduplicated reports dictionary entries, and samples of one profile,
// that are equal in content. Entries are compared by their index content,
// which is their full content because the tables they point into are
// themselves checked for duplicates.
func checkDeduplicated(p pprofile.Profiles) error {
	var errs []error
	d := p.Dictionary()
	unique := func(table string, n int, key func(i int) string) {
		seen := make(map[string]int, n)
		for i := range n {
			k := key(i)
			if j, ok := seen[k]; ok {
				errs = append(errs, fmt.Errorf("%s: entries %d and %d are equal: %s", table, j, i, k))
			}
			seen[k] = i
		}
	}
	ints := func(s pcommon.Int32Slice) string { return fmt.Sprint(s.AsRaw()) }
	unique("string_table", d.StringTable().Len(), func(i int) string { return d.StringTable().At(i) })
	unique("attribute_table", d.AttributeTable().Len(), func(i int) string {
		a := d.AttributeTable().At(i)
		return fmt.Sprintf("%d %d %s %#v", a.KeyStrindex(), a.UnitStrindex(), a.Value().Type(), a.Value().AsRaw())
	})
	unique("function_table", d.FunctionTable().Len(), func(i int) string {
		f := d.FunctionTable().At(i)
		return fmt.Sprint(f.NameStrindex(), f.SystemNameStrindex(), f.FilenameStrindex(), f.StartLine())
	})
	unique("mapping_table", d.MappingTable().Len(), func(i int) string {
		m := d.MappingTable().At(i)
		return fmt.Sprint(m.MemoryStart(), m.MemoryLimit(), m.FileOffset(), m.FilenameStrindex(), ints(m.AttributeIndices()))
	})
	unique("location_table", d.LocationTable().Len(), func(i int) string {
		l := d.LocationTable().At(i)
		var b strings.Builder
		fmt.Fprint(&b, l.MappingIndex(), l.Address(), ints(l.AttributeIndices()))
		for _, ln := range l.Lines().All() {
			fmt.Fprint(&b, " ", ln.FunctionIndex(), ln.Line(), ln.Column())
		}
		return b.String()
	})
	unique("stack_table", d.StackTable().Len(), func(i int) string { return ints(d.StackTable().At(i).LocationIndices()) })
	for ri, rp := range p.ResourceProfiles().All() {
		for pi, prof := range rp.ScopeProfiles().At(0).Profiles().All() {
			unique(fmt.Sprintf("resource[%d].profile[%d].samples", ri, pi), prof.Samples().Len(), func(i int) string {
				s := prof.Samples().At(i)
				attrs := slices.Sorted(slices.Values(s.AttributeIndices().AsRaw()))
				return fmt.Sprint(s.StackIndex(), s.LinkIndex(), attrs)
			})
		}
	}
	return errors.Join(errs...)
}

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
