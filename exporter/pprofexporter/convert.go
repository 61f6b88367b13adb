package pprofexporter

import (
	"github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"
)

// Attribute keys this package reads.
const (
	attrServiceName = "service.name"
	attrExeName     = "process.executable.name"
	attrBuildIDGNU  = "process.executable.build_id.gnu"
	attrBuildIDGo   = "process.executable.build_id.go"
	attrFileID      = "process.executable.build_id.htlhash"

	// labelTimestamp is the numeric label that carries a sample's event
	// times in Unix nanoseconds.
	labelTimestamp = "timestamp"

	unknownService    = "unknown_service"
	unknownExecutable = "unknown"
)

// group is the content of one output file.
type group struct {
	key  string // split key, "" for split_by none
	prof *profile.Profile
}

// converter turns one pprofile.Profiles into pprof profiles, one per group.
// References out of range of the dictionary are skipped and counted, so a
// malformed export still yields what is valid in it. Not safe for concurrent
// use; one converter serves one export.
type converter struct {
	dict    pprofile.ProfilesDictionary
	split   SplitBy
	groups  []*groupBuilder
	byKey   map[string]*groupBuilder
	invalid int // references skipped because they were out of range
}

// groupBuilder accumulates one pprof profile. Dictionary entries become pprof
// entries the first time a sample of the group uses them.
type groupBuilder struct {
	key       string
	p         *profile.Profile
	types     map[profile.ValueType]int // sample type -> index in p.SampleType
	locations map[int32]*profile.Location
	functions map[int32]*profile.Function
	mappings  map[int32]*profile.Mapping
	start     int64 // earliest profile start, Unix ns; -1 until set
	end       int64 // latest profile end, Unix ns
}

// convert converts pd into one pprof profile per group, in order of first
// appearance, and returns how many invalid references it skipped.
func convert(pd pprofile.Profiles, split SplitBy) ([]group, int) {
	c := &converter{dict: pd.Dictionary(), split: split, byKey: map[string]*groupBuilder{}}
	for _, rp := range pd.ResourceProfiles().All() {
		res := rp.Resource().Attributes()
		g := c.group(c.splitKey(res))
		for _, sp := range rp.ScopeProfiles().All() {
			for _, prof := range sp.Profiles().All() {
				c.addProfile(g, res, prof)
			}
		}
	}
	out := make([]group, 0, len(c.groups))
	for _, g := range c.groups {
		if len(g.p.Sample) == 0 {
			continue
		}
		g.finish()
		out = append(out, group{key: g.key, prof: g.p})
	}
	return out, c.invalid
}

func (c *converter) splitKey(res pcommon.Map) string {
	switch c.split {
	case SplitService:
		return strAttr(res, attrServiceName, unknownService)
	case SplitExecutable:
		return strAttr(res, attrExeName, unknownExecutable)
	}
	return ""
}

func strAttr(m pcommon.Map, key, fallback string) string {
	if v, ok := m.Get(key); ok && v.AsString() != "" {
		return v.AsString()
	}
	return fallback
}

func (c *converter) group(key string) *groupBuilder {
	if g, ok := c.byKey[key]; ok {
		return g
	}
	g := &groupBuilder{
		key:       key,
		p:         &profile.Profile{},
		types:     map[profile.ValueType]int{},
		locations: map[int32]*profile.Location{},
		functions: map[int32]*profile.Function{},
		mappings:  map[int32]*profile.Mapping{},
		start:     -1,
	}
	c.byKey[key] = g
	c.groups = append(c.groups, g)
	return g
}

// str returns entry i of the string table, or "" (counted) when i is out of
// range.
func (c *converter) str(i int32) string {
	st := c.dict.StringTable()
	if i < 0 || int(i) >= st.Len() {
		c.invalid++
		return ""
	}
	return st.At(int(i))
}

func (c *converter) addProfile(g *groupBuilder, res pcommon.Map, prof pprofile.Profile) {
	st := profile.ValueType{Type: c.str(prof.SampleType().TypeStrindex()), Unit: c.str(prof.SampleType().UnitStrindex())}
	ti, ok := g.types[st]
	if !ok {
		ti = len(g.p.SampleType)
		g.p.SampleType = append(g.p.SampleType, &profile.ValueType{Type: st.Type, Unit: st.Unit})
		g.types[st] = ti
	}
	if g.p.PeriodType == nil {
		if pt := prof.PeriodType(); pt.TypeStrindex() != 0 || pt.UnitStrindex() != 0 {
			g.p.PeriodType = &profile.ValueType{Type: c.str(pt.TypeStrindex()), Unit: c.str(pt.UnitStrindex())}
			g.p.Period = prof.Period()
		}
	}
	start := int64(prof.Time())
	end := start + int64(min(prof.DurationNano(), 1<<62))
	if g.start < 0 || start < g.start {
		g.start = start
	}
	g.end = max(g.end, end)

	for _, s := range prof.Samples().All() {
		c.addSample(g, res, ti, s)
	}
}

func (c *converter) addSample(g *groupBuilder, res pcommon.Map, ti int, s pprofile.Sample) {
	stacks := c.dict.StackTable()
	si := s.StackIndex()
	if si < 0 || int(si) >= stacks.Len() {
		c.invalid++
		return
	}
	ps := &profile.Sample{}
	for _, li := range stacks.At(int(si)).LocationIndices().All() {
		if loc := c.location(g, li); loc != nil {
			ps.Location = append(ps.Location, loc)
		}
	}

	// OTLP: without values, every timestamp is one occurrence.
	var v int64
	if s.Values().Len() == 0 {
		v = int64(s.TimestampsUnixNano().Len())
	}
	for _, x := range s.Values().All() {
		v += x
	}
	ps.Value = make([]int64, ti+1)
	ps.Value[ti] = v

	for k, val := range res.All() {
		addLabel(ps, k, val)
	}
	attrs := c.dict.AttributeTable()
	for _, ai := range s.AttributeIndices().All() {
		if ai < 0 || int(ai) >= attrs.Len() {
			c.invalid++
			continue
		}
		a := attrs.At(int(ai))
		addLabel(ps, c.str(a.KeyStrindex()), a.Value())
	}
	for _, ts := range s.TimestampsUnixNano().All() {
		if ts == 0 {
			continue // unknown time; a numeric label of 0 would be dropped anyway
		}
		if ps.NumLabel == nil {
			ps.NumLabel = map[string][]int64{}
		}
		ps.NumLabel[labelTimestamp] = append(ps.NumLabel[labelTimestamp], int64(min(ts, 1<<63-1)))
	}
	g.p.Sample = append(g.p.Sample, ps)
}

// addLabel adds an attribute as a string label. Integers are written as
// decimal strings too: profile.proto cannot carry a numeric label of value 0
// without a unit, and CPU 0, PID 0 and TID 0 are common.
func addLabel(s *profile.Sample, key string, v pcommon.Value) {
	val := v.AsString()
	if key == "" || val == "" {
		return // profile.proto drops empty string labels
	}
	if s.Label == nil {
		s.Label = map[string][]string{}
	}
	s.Label[key] = append(s.Label[key], val)
}

// location returns the pprof location of dictionary entry li, creating it
// (with its mapping and functions) on first use; nil when li is out of range.
func (c *converter) location(g *groupBuilder, li int32) *profile.Location {
	if l, ok := g.locations[li]; ok {
		return l
	}
	lt := c.dict.LocationTable()
	if li < 0 || int(li) >= lt.Len() {
		c.invalid++
		return nil
	}
	pl := lt.At(int(li))
	l := &profile.Location{
		ID:      uint64(len(g.p.Location) + 1),
		Address: pl.Address(),
		Mapping: c.mapping(g, pl.MappingIndex()),
	}
	for _, ln := range pl.Lines().All() {
		fn := c.function(g, ln.FunctionIndex())
		if fn == nil {
			continue
		}
		l.Line = append(l.Line, profile.Line{Function: fn, Line: ln.Line(), Column: ln.Column()})
	}
	g.p.Location = append(g.p.Location, l)
	g.locations[li] = l
	return l
}

// function returns the pprof function of dictionary entry fi; nil for the
// empty entry 0 and (counted) for indices out of range.
func (c *converter) function(g *groupBuilder, fi int32) *profile.Function {
	if fi == 0 {
		return nil
	}
	if f, ok := g.functions[fi]; ok {
		return f
	}
	ft := c.dict.FunctionTable()
	if fi < 0 || int(fi) >= ft.Len() {
		c.invalid++
		return nil
	}
	pf := ft.At(int(fi))
	f := &profile.Function{
		ID:         uint64(len(g.p.Function) + 1),
		Name:       c.str(pf.NameStrindex()),
		SystemName: c.str(pf.SystemNameStrindex()),
		Filename:   c.str(pf.FilenameStrindex()),
		StartLine:  pf.StartLine(),
	}
	if f.SystemName == "" {
		f.SystemName = f.Name
	}
	g.p.Function = append(g.p.Function, f)
	g.functions[fi] = f
	return f
}

// mapping returns the pprof mapping of dictionary entry mi; nil for the empty
// entry 0 and (counted) for indices out of range.
func (c *converter) mapping(g *groupBuilder, mi int32) *profile.Mapping {
	if mi == 0 {
		return nil
	}
	if m, ok := g.mappings[mi]; ok {
		return m
	}
	mt := c.dict.MappingTable()
	if mi < 0 || int(mi) >= mt.Len() {
		c.invalid++
		return nil
	}
	pm := mt.At(int(mi))
	m := &profile.Mapping{
		ID:     uint64(len(g.p.Mapping) + 1),
		Start:  pm.MemoryStart(),
		Limit:  pm.MemoryLimit(),
		Offset: pm.FileOffset(),
		File:   c.str(pm.FilenameStrindex()),
	}
	ids := map[string]string{}
	attrs := c.dict.AttributeTable()
	for _, ai := range pm.AttributeIndices().All() {
		if ai < 0 || int(ai) >= attrs.Len() {
			c.invalid++
			continue
		}
		a := attrs.At(int(ai))
		ids[c.str(a.KeyStrindex())] = a.Value().AsString()
	}
	for _, k := range []string{attrBuildIDGNU, attrBuildIDGo, attrFileID} {
		if ids[k] != "" {
			m.BuildID = ids[k]
			break
		}
	}
	g.p.Mapping = append(g.p.Mapping, m)
	g.mappings[mi] = m
	return m
}

// finish pads every sample to the group's sample types, sets the time range
// and the default sample type, and says which mappings are already
// symbolized, so pprof does not try to name their frames again.
func (g *groupBuilder) finish() {
	n := len(g.p.SampleType)
	for _, s := range g.p.Sample {
		if len(s.Value) < n {
			s.Value = append(s.Value, make([]int64, n-len(s.Value))...)
		}
	}
	g.p.DefaultSampleType = g.p.SampleType[0].Type
	if g.start > 0 {
		g.p.TimeNanos = g.start
		g.p.DurationNanos = max(g.end-g.start, 0)
	}

	type flags struct{ unnamed, files, lines, inline bool }
	seen := map[*profile.Mapping]*flags{}
	for _, l := range g.p.Location {
		if l.Mapping == nil {
			continue
		}
		f := seen[l.Mapping]
		if f == nil {
			f = &flags{}
			seen[l.Mapping] = f
		}
		f.unnamed = f.unnamed || len(l.Line) == 0
		f.inline = f.inline || len(l.Line) > 1
		for _, ln := range l.Line {
			f.files = f.files || ln.Function.Filename != ""
			f.lines = f.lines || ln.Line > 0
		}
	}
	for m, f := range seen {
		m.HasFunctions = !f.unnamed
		m.HasFilenames = f.files
		m.HasLineNumbers = f.lines
		m.HasInlineFrames = f.inline
	}
}
