package profile

import (
	"encoding/binary"
	"hash/maphash"
	"maps"
	"slices"
	"time"
)

// Builder aggregates the samples of one interval. It is not safe for
// concurrent use: the caller serializes Add, Len, Stats and Flush.
//
// While an interval runs the builder keeps its own dictionary whose indices
// are already those of the output (index 0 of every table is the empty
// value). Every table is deduplicated through Go maps keyed by the full
// content of the entry (comparable structs or canonical byte strings), never
// by a hash alone. Once strings, functions, mappings, locations and stacks
// are known, Add does not allocate.
type Builder struct {
	opts       Options
	maxSamples int
	maxFrames  int

	strings   []string
	stringIdx map[string]int32

	functions   []function
	functionIdx map[functionKey]int32

	mappings   []Mapping
	mappingIdx map[Mapping]int32

	locations   []location
	lines       []line           // lines of all locations, by location
	locationIdx map[string]int32 // canonical location encoding -> index

	stacks    []span
	stackLocs []int32          // location indices of all stacks, leaf first
	stackIdx  map[string]int32 // canonical stack encoding -> index

	resources   []Resource       // copies, in order of first appearance
	resourceIdx map[string]int32 // canonical resource encoding -> index

	samples   []sampleKey // distinct samples, in order of first appearance
	sampleIdx map[sampleKey]int32
	events    []event

	// Keys of repeated stacks (repeat.go): each key's entry, the words of
	// all keys, and the first entry of each hash, whose entries chain.
	keys     []keyEntry
	keyWords []uint64
	keyIdx   map[uint64]int32
	keySeed  maphash.Seed

	// Direct-mapped caches of recent lookups, indexed by a mix of cheap
	// fields. A hit is only a candidate: it is used after comparing the full
	// content, so a collision or a changed input costs a slow lookup, never a
	// wrong entry. 0 marks an empty slot (resource slots hold index+1).
	locationCache [locationCacheSize]int32
	resourceCache [resourceCacheSize]int32

	// Scratch space reused by Add and Flush.
	key      []byte
	locs     []int32
	envNames []string
	attrIdx  map[attrKey]int32
	attrs    []attrKey

	stats Stats
}

type function struct{ name, systemName, file int32 }

type functionKey struct{ name, systemName, file string }

type location struct {
	mapping int32
	address uint64
	typ     FrameType
	fp      bool   // found by the frame-pointer fallback
	tier    string // Frame.Tier
	lines   span   // into Builder.lines
}

// line is one line of a location: its function index and, for the fast
// path of location, the Line it was made from.
type line struct {
	function int32
	Line
}

// span is the half-open range [start, end) of a flat slice.
type span struct{ start, end int32 }

// sampleKey is the identity of an output sample: same process, kind, stack
// and sample attributes.
type sampleKey struct {
	resource   int32
	kind       Kind
	stack      int32
	tid        int64
	cpu        int64
	threadName string
}

type event struct {
	sample int32
	time   uint64
	value  int64
}

const (
	locationCacheBits = 12
	locationCacheSize = 1 << locationCacheBits
	resourceCacheBits = 8
	resourceCacheSize = 1 << resourceCacheBits
)

// NewBuilder returns an empty Builder.
func NewBuilder(opts Options) *Builder {
	b := &Builder{opts: opts, maxSamples: opts.MaxSamples, maxFrames: opts.MaxFrames, keySeed: maphash.MakeSeed()}
	if b.maxSamples <= 0 {
		b.maxSamples = DefaultMaxSamples
	}
	if b.maxFrames <= 0 {
		b.maxFrames = DefaultMaxFrames
	}
	b.reset()
	return b
}

// Len returns the number of sample events added since the last Flush.
func (b *Builder) Len() int { return len(b.events) }

// Span returns the earliest and latest time of the events added since the
// last Flush (events without a time excluded); ok is false when there are
// none.
func (b *Builder) Span() (first, last time.Time, ok bool) {
	var lo, hi uint64
	for _, e := range b.events {
		if e.time == 0 {
			continue
		}
		if !ok || e.time < lo {
			lo = e.time
		}
		if !ok || e.time > hi {
			hi = e.time
		}
		ok = true
	}
	if !ok {
		return time.Time{}, time.Time{}, false
	}
	return time.Unix(0, int64(lo)), time.Unix(0, int64(hi)), true
}

// Stats returns the counters since NewBuilder.
func (b *Builder) Stats() Stats { return b.stats }

// Add records one sample event. It keeps no reference to s.Resource or its
// map, nor to s.Frames; it keeps the strings and copies of the Mappings.
func (b *Builder) Add(s Sample) { b.add(&s) }

// add is Add; it returns the sample's resource and stack, whether its
// stack was cut to MaxFrames, and whether it was added.
func (b *Builder) add(s *Sample) (res, stack int32, truncated, ok bool) {
	if s.Kind >= numKinds {
		b.stats.Invalid++
		return 0, 0, false, false
	}
	if len(b.events) >= b.maxSamples {
		b.stats.Dropped++
		return 0, 0, false, false
	}
	frames := s.Frames
	if len(frames) > b.maxFrames {
		frames = frames[:b.maxFrames]
		b.stats.Truncated++
		truncated = true
	}

	res = b.resource(s.Resource)
	locs := b.locs[:0]
	for i := range frames {
		locs = append(locs, b.location(&frames[i]))
	}
	b.locs = locs
	stack = b.stack(locs)
	b.addEvent(res, stack, s)
	return res, stack, truncated, true
}

// addEvent adds the event of s, whose resource and stack are known.
func (b *Builder) addEvent(res, stack int32, s *Sample) {
	k := sampleKey{resource: res, kind: s.Kind, stack: stack, tid: s.TID, cpu: s.CPU, threadName: s.ThreadName}
	idx, ok := b.sampleIdx[k]
	if !ok {
		idx = int32(len(b.samples))
		b.samples = append(b.samples, k)
		b.sampleIdx[k] = idx
	}
	v := s.Value
	if s.Kind == OnCPU && v == 0 {
		v = 1
	}
	b.events = append(b.events, event{sample: idx, time: unixNano(s.Time), value: v})
	b.stats.Added++
}

func unixNano(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	n := t.UnixNano()
	if n < 0 {
		return 0
	}
	return uint64(n)
}

// str interns s in the string table.
func (b *Builder) str(s string) int32 {
	if i, ok := b.stringIdx[s]; ok {
		return i
	}
	i := int32(len(b.strings))
	b.strings = append(b.strings, s)
	b.stringIdx[s] = i
	return i
}

func (b *Builder) function(l *Line) int32 {
	k := functionKey{l.Function, l.SystemName, l.File}
	if i, ok := b.functionIdx[k]; ok {
		return i
	}
	i := int32(len(b.functions))
	b.functions = append(b.functions, function{b.str(k.name), b.str(k.systemName), b.str(k.file)})
	b.functionIdx[k] = i
	return i
}

func (b *Builder) mapping(m *Mapping) int32 {
	if m == nil {
		return 0
	}
	if i, ok := b.mappingIdx[*m]; ok {
		return i
	}
	i := int32(len(b.mappings))
	b.mappings = append(b.mappings, *m)
	b.mappingIdx[*m] = i
	b.str(m.File)
	return i
}

// location interns the location of f. Its canonical encoding is the frame
// type, the address, the mapping index, then function index and line number
// of each line; the indices of mappings and functions stand for their full
// content because those tables are deduplicated by content themselves.
func (b *Builder) location(f *Frame) int32 {
	typ := f.Type
	if typ.String() == "" {
		typ = FrameUnknown // out-of-range types are written like FrameUnknown
	}
	slot := cacheSlot(f.Address^uint64(typ), locationCacheBits)
	if i := b.locationCache[slot]; i != 0 && b.isLocation(i, typ, f) {
		return i
	}
	i := b.internLocation(typ, f)
	b.locationCache[slot] = i
	return i
}

// cacheSlot maps v to one of 1<<bits slots (Fibonacci hashing).
func cacheSlot(v uint64, bits uint) uint64 {
	return (v * 0x9e3779b97f4a7c15) >> (64 - bits)
}

// isLocation reports whether location i has exactly the content of f. String
// comparisons are cheap when the caller reuses the strings it passed before.
func (b *Builder) isLocation(i int32, typ FrameType, f *Frame) bool {
	l := &b.locations[i]
	if l.address != f.Address || l.typ != typ || l.fp != f.FramePointer || l.tier != f.Tier || int(l.lines.end-l.lines.start) != len(f.Lines) {
		return false
	}
	if f.Mapping == nil {
		if l.mapping != 0 {
			return false
		}
	} else if b.mappings[l.mapping] != *f.Mapping {
		return false
	}
	for j, ln := range b.lines[l.lines.start:l.lines.end] {
		if ln.Line != f.Lines[j] {
			return false
		}
	}
	return true
}

// internLocation is the slow path of location: a lookup by canonical
// encoding.
func (b *Builder) internLocation(typ FrameType, f *Frame) int32 {
	m := b.mapping(f.Mapping)
	key := b.key[:0]
	key = append(key, byte(typ))
	if f.FramePointer {
		key = append(key, 1)
	} else {
		key = append(key, 0)
	}
	key = binary.LittleEndian.AppendUint64(key, f.Address)
	key = binary.AppendUvarint(key, uint64(m))
	key = binary.AppendUvarint(key, uint64(len(f.Tier)))
	key = append(key, f.Tier...)
	for i := range f.Lines {
		key = binary.AppendUvarint(key, uint64(b.function(&f.Lines[i])))
		key = binary.AppendVarint(key, max(f.Lines[i].Line, 0))
	}
	b.key = key
	if i, ok := b.locationIdx[string(key)]; ok {
		return i
	}
	start := int32(len(b.lines))
	for i := range f.Lines {
		// A negative line (a corrupt line program, or interpreter memory
		// read as it changed) is unknown: OTLP lines are not negative.
		ln := f.Lines[i]
		ln.Line = max(ln.Line, 0)
		b.lines = append(b.lines, line{function: b.function(&f.Lines[i]), Line: ln})
	}
	i := int32(len(b.locations))
	b.locations = append(b.locations, location{
		mapping: m, address: f.Address, typ: typ, fp: f.FramePointer, tier: f.Tier,
		lines: span{start, int32(len(b.lines))},
	})
	b.locationIdx[string(key)] = i
	return i
}

// stack interns a stack given as location indices, leaf first.
func (b *Builder) stack(locs []int32) int32 {
	key := b.key[:0]
	for _, l := range locs {
		key = binary.AppendUvarint(key, uint64(l))
	}
	b.key = key
	if i, ok := b.stackIdx[string(key)]; ok {
		return i
	}
	start := int32(len(b.stackLocs))
	b.stackLocs = append(b.stackLocs, locs...)
	i := int32(len(b.stacks))
	b.stacks = append(b.stacks, span{start, int32(len(b.stackLocs))})
	b.stackIdx[string(key)] = i
	return i
}

// resource interns a copy of r, keyed by its canonical encoding: every field
// length-prefixed, environment variables sorted by name.
func (b *Builder) resource(r *Resource) int32 {
	var zero Resource
	if r == nil {
		r = &zero
	}
	slot := cacheSlot(uint64(r.PID), resourceCacheBits)
	if i := b.resourceCache[slot] - 1; i >= 0 && sameResource(&b.resources[i], r) {
		return i
	}
	i := b.internResource(r)
	b.resourceCache[slot] = i + 1
	return i
}

func sameResource(a, b *Resource) bool {
	return a.PID == b.PID && a.ExecutableName == b.ExecutableName && a.ExecutablePath == b.ExecutablePath &&
		a.ContainerID == b.ContainerID && a.ServiceName == b.ServiceName && maps.Equal(a.EnvVars, b.EnvVars) &&
		a.CommandLine == b.CommandLine && a.NamespacePID == b.NamespacePID
}

func (b *Builder) internResource(r *Resource) int32 {
	key := binary.AppendVarint(b.key[:0], r.PID)
	key = appendString(key, r.ExecutableName)
	key = appendString(key, r.ExecutablePath)
	key = appendString(key, r.ContainerID)
	key = appendString(key, r.ServiceName)
	key = appendString(key, r.CommandLine)
	key = binary.AppendVarint(key, r.NamespacePID)
	names := b.envNames[:0]
	for name := range r.EnvVars {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		key = appendString(key, name)
		key = appendString(key, r.EnvVars[name])
	}
	clear(names)
	b.envNames = names[:0]
	b.key = key
	if i, ok := b.resourceIdx[string(key)]; ok {
		return i
	}
	i := int32(len(b.resources))
	c := *r
	c.EnvVars = maps.Clone(r.EnvVars)
	b.resources = append(b.resources, c)
	b.resourceIdx[string(key)] = i
	return i
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// Reuse policy: tables are emptied in place so the next interval reuses their
// memory, except after an unusually large interval, whose memory is released
// rather than kept for good.
const (
	retainMapEntries = 1 << 16
	retainSliceMin   = 1 << 12
)

func resetMap[K comparable, V any](m map[K]V) map[K]V {
	if m == nil || len(m) > retainMapEntries {
		return make(map[K]V)
	}
	clear(m)
	return m
}

// resetSlice empties s, zeroing its elements so the garbage collector can
// free what they point to. A backing array much larger than what the last
// interval used is released.
func resetSlice[T any](s []T) []T {
	if cap(s) > retainSliceMin && cap(s) > 4*len(s) {
		return nil
	}
	clear(s)
	return s[:0]
}

// Discard drops what was added since the last Flush, as Flush does, without
// building profiles of it: the interval is thrown away, the builder is
// ready for the next one.
func (b *Builder) Discard() { b.reset() }

// reset empties every table and seeds index 0 with the empty value.
func (b *Builder) reset() {
	b.strings = append(resetSlice(b.strings), "")
	b.stringIdx = resetMap(b.stringIdx)
	b.stringIdx[""] = 0

	b.functions = append(resetSlice(b.functions), function{})
	b.functionIdx = resetMap(b.functionIdx)
	b.functionIdx[functionKey{}] = 0

	b.mappings = append(resetSlice(b.mappings), Mapping{})
	b.mappingIdx = resetMap(b.mappingIdx)
	b.mappingIdx[Mapping{}] = 0

	b.locations = append(resetSlice(b.locations), location{})
	b.lines = resetSlice(b.lines)
	b.locationIdx = resetMap(b.locationIdx)
	b.locationIdx[string(b.location0Key())] = 0

	b.stacks = append(resetSlice(b.stacks), span{})
	b.stackLocs = resetSlice(b.stackLocs)
	b.stackIdx = resetMap(b.stackIdx)
	b.stackIdx[""] = 0

	b.resources = resetSlice(b.resources)
	b.resourceIdx = resetMap(b.resourceIdx)
	b.samples = resetSlice(b.samples)
	b.sampleIdx = resetMap(b.sampleIdx)
	b.events = resetSlice(b.events)
	b.keys = resetSlice(b.keys)
	b.keyWords = resetSlice(b.keyWords)
	b.keyIdx = resetMap(b.keyIdx)

	clear(b.locationCache[:])
	clear(b.resourceCache[:])

	b.attrs = append(resetSlice(b.attrs), attrKey{})
	b.attrIdx = resetMap(b.attrIdx)
	b.attrIdx[attrKey{}] = 0
}

// location0Key is the encoding of the empty location (unknown type, address
// 0, no mapping, no lines), which is index 0.
func (b *Builder) location0Key() []byte {
	key := append(b.key[:0], byte(FrameUnknown), 0)
	key = binary.LittleEndian.AppendUint64(key, 0)
	key = binary.AppendUvarint(key, 0) // mapping
	key = binary.AppendUvarint(key, 0) // tier: none
	b.key = key
	return key
}
