package profile

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"
)

// Check applies the rules of the profiling SIG's conformance checker
// (profcheck) to p, and returns every problem found: every index is in
// range of its dictionary table, index 0 of every table is the empty value,
// a mapping's range is empty or start < limit, no attribute list repeats a
// key, each sample pairs values and timestamps one to one with one shape
// per profile, and every sample timestamp lies in its profile's window
// [time, time+duration).
func Check(p pprofile.Profiles) error {
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
	// uniqueKeys reports an attribute list that names a key twice.
	uniqueKeys := func(what string, s pcommon.Int32Slice) {
		seen := map[int32]int{}
		for j, i := range s.All() {
			if i < 0 || int(i) >= nAttr {
				continue // reported as out of range
			}
			k := d.AttributeTable().At(int(i)).KeyStrindex()
			if prev, dup := seen[k]; dup {
				bad("%s[%d]: key %d already at [%d]", what, j, k, prev)
			}
			seen[k] = j
		}
	}
	for i, m := range d.MappingTable().All() {
		in(fmt.Sprintf("mapping_table[%d].filename", i), m.FilenameStrindex(), nStr)
		inAll(fmt.Sprintf("mapping_table[%d].attributes", i), m.AttributeIndices(), nAttr)
		uniqueKeys(fmt.Sprintf("mapping_table[%d].attributes", i), m.AttributeIndices())
		if (m.MemoryStart() != 0 || m.MemoryLimit() != 0) && m.MemoryStart() >= m.MemoryLimit() {
			bad("mapping_table[%d]: memory_start %#x, memory_limit %#x: must be both zero or start < limit", i, m.MemoryStart(), m.MemoryLimit())
		}
	}
	for i, l := range d.LocationTable().All() {
		in(fmt.Sprintf("location_table[%d].mapping", i), l.MappingIndex(), nMap)
		inAll(fmt.Sprintf("location_table[%d].attributes", i), l.AttributeIndices(), nAttr)
		uniqueKeys(fmt.Sprintf("location_table[%d].attributes", i), l.AttributeIndices())
		for j, ln := range l.Lines().All() {
			in(fmt.Sprintf("location_table[%d].line[%d].function", i, j), ln.FunctionIndex(), nFn)
			if ln.Line() < 0 || ln.Column() < 0 {
				bad("location_table[%d].line[%d]: line %d, column %d: must not be negative", i, j, ln.Line(), ln.Column())
			}
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
				uniqueKeys(at+".attributes", prof.AttributeIndices())
				start := uint64(prof.Time())
				end := start + prof.DurationNano()
				shape := -1 // of the first sample: values, timestamps or both
				for i, s := range prof.Samples().All() {
					sat := fmt.Sprintf("%s.sample[%d]", at, i)
					in(sat+".stack", s.StackIndex(), nStack)
					in(sat+".link", s.LinkIndex(), nLink)
					inAll(sat+".attributes", s.AttributeIndices(), nAttr)
					uniqueKeys(sat+".attributes", s.AttributeIndices())
					nv, nt := s.Values().Len(), s.TimestampsUnixNano().Len()
					if nv == 0 && nt == 0 {
						bad("%s has neither values nor timestamps", sat)
					}
					if nv != 0 && nt != 0 && nv != nt {
						bad("%s has %d values but %d timestamps", sat, nv, nt)
					}
					if nt == 0 && nv > 1 {
						bad("%s has %d values and no timestamps: one value without timestamps", sat, nv)
					}
					sh := min(nv, 1) + 2*min(nt, 1)
					if shape < 0 {
						shape = sh
					} else if sh != shape {
						bad("%s: not the same values/timestamps shape as the profile's first sample", sat)
					}
					for j, ts := range s.TimestampsUnixNano().All() {
						if ts < start || ts >= end {
							bad("%s.timestamps_unix_nano[%d] = %d is outside the profile's time range [%d, %d)", sat, j, ts, start, end)
						}
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

// CheckDeduplicated reports dictionary entries, and samples of one profile,
// that are equal in content. Entries are compared by their index content,
// which is their full content because the tables they point into are
// themselves checked for duplicates.
func CheckDeduplicated(p pprofile.Profiles) error {
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
