package profile

import (
	"maps"
	"slices"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"
)

// attrKey is the content of an entry of the attribute table; values are
// either strings or integers, and no unit is ever set.
type attrKey struct {
	key   int32
	isInt bool
	i     int64
	s     string
}

func (b *Builder) attr(k attrKey) int32 {
	if i, ok := b.attrIdx[k]; ok {
		return i
	}
	i := int32(len(b.attrs))
	b.attrs = append(b.attrs, k)
	b.attrIdx[k] = i
	return i
}

func (b *Builder) attrStr(key int32, v string) int32 {
	return b.attr(attrKey{key: key, s: v})
}

func (b *Builder) attrInt(key int32, v int64) int32 {
	return b.attr(attrKey{key: key, isInt: true, i: v})
}

// Flush returns everything added since the last Flush as one
// pprofile.Profiles covering [start, end) and resets the builder, reusing its
// memory where cheap. The window is widened to cover every event's time, so
// no sample timestamp lies outside its profile's window. An empty interval
// returns a Profiles with no ResourceProfiles (its dictionary still holds the
// index-0 entries). The result shares no memory with the builder.
func (b *Builder) Flush(start, end time.Time) pprofile.Profiles {
	if first, last, ok := b.Span(); ok {
		if first.Before(start) {
			start = first
		}
		if !last.Before(end) { // the window is half-open: [start, end)
			end = last.Add(time.Nanosecond)
		}
	}
	p := pprofile.NewProfiles()
	b.writeResources(p, start, end)
	b.writeDictionary(p.Dictionary())
	b.reset()
	return p
}

func (b *Builder) writeResources(p pprofile.Profiles, start, end time.Time) {
	if len(b.events) == 0 {
		return
	}
	times, values, offsets := b.groupEvents()

	// One slot per (resource, kind): how many samples, then the Profile.
	type slot struct {
		n       int
		profile pprofile.Profile
	}
	slots := make([]slot, len(b.resources)*numKinds)
	for _, s := range b.samples {
		slots[int(s.resource)*numKinds+int(s.kind)].n++
	}

	startNano := unixNano(start)
	var duration uint64
	if d := end.Sub(start); d > 0 {
		duration = uint64(d)
	}
	scopeVersion := b.opts.ScopeVersion

	rps := p.ResourceProfiles()
	rps.EnsureCapacity(len(b.resources))
	for ri := range b.resources {
		rp := rps.AppendEmpty()
		rp.SetSchemaUrl(SchemaURL)
		writeResource(rp.Resource().Attributes(), &b.resources[ri])
		sp := rp.ScopeProfiles().AppendEmpty()
		sp.SetSchemaUrl(SchemaURL)
		sp.Scope().SetName(ScopeName)
		sp.Scope().SetVersion(scopeVersion)
		for k := Kind(0); k < numKinds; k++ {
			sl := &slots[ri*numKinds+int(k)]
			if sl.n == 0 {
				continue
			}
			prof := sp.Profiles().AppendEmpty()
			prof.SetTime(pcommon.Timestamp(startNano))
			prof.SetDurationNano(duration)
			b.setTypes(prof, k)
			prof.Samples().EnsureCapacity(sl.n)
			sl.profile = prof
		}
	}

	keyTID, keyCPU := b.str(attrThreadID), b.str(attrCPU)
	for si, s := range b.samples {
		ps := slots[int(s.resource)*numKinds+int(s.kind)].profile.Samples().AppendEmpty()
		ps.SetStackIndex(s.stack)
		ai := ps.AttributeIndices()
		ai.EnsureCapacity(3)
		ai.Append(b.attrInt(keyTID, s.tid))
		if s.threadName != "" {
			ai.Append(b.attrStr(b.str(attrThreadName), s.threadName))
		}
		ai.Append(b.attrInt(keyCPU, s.cpu))
		lo, hi := offsets[si], offsets[si+1]
		ps.TimestampsUnixNano().FromRaw(times[lo:hi])
		ps.Values().FromRaw(values[lo:hi])
	}
}

// groupEvents orders the events by sample (a stable counting sort, so the
// events of a sample keep the order they were added in). The events of sample
// i are times[offsets[i]:offsets[i+1]] and the values at the same positions.
func (b *Builder) groupEvents() (times []uint64, values []int64, offsets []int) {
	offsets = make([]int, len(b.samples)+1)
	for _, e := range b.events {
		offsets[e.sample+1]++
	}
	for i := 1; i < len(offsets); i++ {
		offsets[i] += offsets[i-1]
	}
	next := slices.Clone(offsets[:len(b.samples)])
	times = make([]uint64, len(b.events))
	values = make([]int64, len(b.events))
	for _, e := range b.events {
		j := next[e.sample]
		next[e.sample]++
		times[j], values[j] = e.time, e.value
	}
	return times, values, offsets
}

func (b *Builder) setTypes(prof pprofile.Profile, k Kind) {
	switch k {
	case OnCPU:
		prof.SampleType().SetTypeStrindex(b.str("samples"))
		prof.SampleType().SetUnitStrindex(b.str("count"))
		prof.PeriodType().SetTypeStrindex(b.str("cpu"))
		prof.PeriodType().SetUnitStrindex(b.str("nanoseconds"))
		if b.opts.SamplesPerSecond > 0 {
			prof.SetPeriod(1e9 / int64(b.opts.SamplesPerSecond))
		}
	case OffCPU:
		// Off-CPU events are not taken at a fixed period: no period type.
		prof.SampleType().SetTypeStrindex(b.str("off_cpu"))
		prof.SampleType().SetUnitStrindex(b.str("nanoseconds"))
	}
}

func writeResource(attrs pcommon.Map, r *Resource) {
	attrs.EnsureCapacity(7 + len(r.EnvVars))
	attrs.PutInt(attrPID, r.PID)
	putNonEmpty(attrs, attrExeName, r.ExecutableName)
	putNonEmpty(attrs, attrExePath, r.ExecutablePath)
	putNonEmpty(attrs, attrContainerID, r.ContainerID)
	putNonEmpty(attrs, attrServiceName, r.ServiceName)
	putNonEmpty(attrs, attrCommandLine, r.CommandLine)
	if r.NamespacePID != 0 {
		attrs.PutInt(attrNamespacePID, r.NamespacePID)
	}
	for _, name := range slices.Sorted(maps.Keys(r.EnvVars)) {
		attrs.PutStr(attrEnvVarPrefix+name, r.EnvVars[name])
	}
}

func putNonEmpty(attrs pcommon.Map, key, v string) {
	if v != "" {
		attrs.PutStr(key, v)
	}
}

// writeDictionary writes the interval's tables. Attribute entries are interned
// here, so the string table, which they extend, is written last.
func (b *Builder) writeDictionary(d pprofile.ProfilesDictionary) {
	mt := d.MappingTable()
	mt.EnsureCapacity(len(b.mappings))
	for i := range b.mappings {
		m := &b.mappings[i]
		pm := mt.AppendEmpty()
		pm.SetMemoryStart(m.Start)
		pm.SetMemoryLimit(m.Limit)
		pm.SetFileOffset(m.Offset)
		pm.SetFilenameStrindex(b.str(m.File))
		for _, a := range [...]struct{ key, v string }{
			{attrBuildIDGNU, m.GNUBuildID}, {attrBuildIDGo, m.GoBuildID}, {attrFileID, m.FileID},
		} {
			if a.v != "" {
				pm.AttributeIndices().Append(b.attrStr(b.str(a.key), a.v))
			}
		}
	}

	ft := d.FunctionTable()
	ft.EnsureCapacity(len(b.functions))
	for _, f := range b.functions {
		pf := ft.AppendEmpty()
		pf.SetNameStrindex(f.name)
		pf.SetSystemNameStrindex(f.systemName)
		pf.SetFilenameStrindex(f.file)
	}

	lt := d.LocationTable()
	lt.EnsureCapacity(len(b.locations))
	for _, l := range b.locations {
		pl := lt.AppendEmpty()
		pl.SetMappingIndex(l.mapping)
		pl.SetAddress(l.address)
		if t := l.typ.String(); t != "" {
			pl.AttributeIndices().Append(b.attrStr(b.str(attrFrameType), t))
		}
		if l.fp {
			pl.AttributeIndices().Append(b.attrStr(b.str(attrUnwinder), unwinderFramePointer))
		}
		if l.tier != "" {
			pl.AttributeIndices().Append(b.attrStr(b.str(attrTier), l.tier))
		}
		lines := b.lines[l.lines.start:l.lines.end]
		pl.Lines().EnsureCapacity(len(lines))
		for _, ln := range lines {
			pln := pl.Lines().AppendEmpty()
			pln.SetFunctionIndex(ln.function)
			pln.SetLine(ln.Line.Line)
		}
	}

	st := d.StackTable()
	st.EnsureCapacity(len(b.stacks))
	for _, s := range b.stacks {
		st.AppendEmpty().LocationIndices().FromRaw(b.stackLocs[s.start:s.end])
	}

	d.LinkTable().AppendEmpty() // index 0: the empty link; samples have none

	at := d.AttributeTable()
	at.EnsureCapacity(len(b.attrs))
	for _, a := range b.attrs {
		pa := at.AppendEmpty()
		pa.SetKeyStrindex(a.key)
		switch {
		case a.key == 0:
			// index 0: the empty attribute, with an empty value
		case a.isInt:
			pa.Value().SetInt(a.i)
		default:
			pa.Value().SetStr(a.s)
		}
	}

	d.StringTable().FromRaw(b.strings)
}
