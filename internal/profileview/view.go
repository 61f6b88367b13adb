// Package profileview reads OTLP profiles (pdata) as resolved samples: each
// sample with its resource, profile type, attributes and frames, leaf first,
// the dictionary references already followed. The readable-stacks printer,
// the SQLite exporter and the profile-metrics connector read profiles
// through it, so they agree on what a frame and a sample are.
//
// References out of range of the dictionary are skipped and counted, never
// trusted: a malformed export yields what is valid in it.
package profileview

import (
	"iter"
	"path/filepath"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"
)

// AttrFrameType is the location attribute that names a frame's runtime.
const AttrFrameType = "profile.frame.type"

// Frame is one function of a stack. A location with inline functions gives
// one Frame per function, innermost first; a location without functions
// gives one Frame with an empty Function.
type Frame struct {
	Type       string // profile.frame.type of the location; "" if it has none
	Function   string
	SystemName string
	File       string // source file
	Line       int64
	Address    uint64
	Mapping    string // file of the location's mapping; "" if it has none
	// Location is the dictionary index of the frame's location: frames of
	// one location share it.
	Location int32
}

// Name is the frame's function, or "[mapping base name]" or "[unknown]" for
// a frame without one, as the pprof exporter names such frames.
func (f *Frame) Name() string {
	switch {
	case f.Function != "":
		return f.Function
	case f.Mapping != "":
		return "[" + filepath.Base(f.Mapping) + "]"
	}
	return "[unknown]"
}

// Attr is a sample attribute, its value as text.
type Attr struct {
	Key, Value string
}

// Sample is one OTLP sample, resolved.
type Sample struct {
	// ResourceIndex is the index of the sample's ResourceProfiles in the
	// export; Resource holds its attributes.
	ResourceIndex int
	Resource      pcommon.Map
	// Type and Unit are the profile's sample type ("samples", "count").
	Type, Unit string
	// PeriodType, PeriodUnit and Period are the profile's sampling period
	// ("cpu", "nanoseconds", 52631578); Period is 0 without one.
	PeriodType, PeriodUnit string
	Period                 int64
	// Start and Duration are the profile's time range, Unix nanoseconds.
	Start, Duration uint64
	// Stack is the dictionary index of the stack; Frames its frames, leaf
	// first. Frames is shared by every sample of the stack: do not modify.
	Stack  int32
	Frames []Frame
	// Value is the sum of the sample's values, or the number of its
	// timestamps when it has no values (OTLP: each timestamp is one
	// occurrence). Events is the number of timestamps, or 1 without any.
	Value  int64
	Events int64
	// Timestamps are the sample's event times, Unix nanoseconds.
	Timestamps pcommon.UInt64Slice
	Attrs      []Attr
}

// Reader resolves the samples of one export. Not safe for concurrent use.
type Reader struct {
	pd     pprofile.Profiles
	dict   pprofile.ProfilesDictionary
	stacks map[int32][]Frame
	locs   map[int32][]Frame
	// Invalid counts references out of range skipped so far.
	Invalid int
}

// NewReader returns a Reader of pd.
func NewReader(pd pprofile.Profiles) *Reader {
	return &Reader{pd: pd, dict: pd.Dictionary(), stacks: map[int32][]Frame{}, locs: map[int32][]Frame{}}
}

// Str returns entry i of the string table, or "" (counted) when i is out of
// range.
func (r *Reader) Str(i int32) string {
	st := r.dict.StringTable()
	if i < 0 || int(i) >= st.Len() {
		r.Invalid++
		return ""
	}
	return st.At(int(i))
}

// Samples yields every sample of the export in order. The yielded Sample is
// reused: copy what must outlive the iteration step. Samples whose stack is
// out of range are skipped and counted.
func (r *Reader) Samples() iter.Seq[*Sample] {
	return func(yield func(*Sample) bool) {
		var s Sample
		for ri, rp := range r.pd.ResourceProfiles().All() {
			s.ResourceIndex = ri
			s.Resource = rp.Resource().Attributes()
			for _, sp := range rp.ScopeProfiles().All() {
				for _, prof := range sp.Profiles().All() {
					s.Type = r.Str(prof.SampleType().TypeStrindex())
					s.Unit = r.Str(prof.SampleType().UnitStrindex())
					s.PeriodType = r.Str(prof.PeriodType().TypeStrindex())
					s.PeriodUnit = r.Str(prof.PeriodType().UnitStrindex())
					s.Period = prof.Period()
					s.Start = uint64(prof.Time())
					s.Duration = prof.DurationNano()
					for _, ps := range prof.Samples().All() {
						frames, ok := r.Stack(ps.StackIndex())
						if !ok {
							continue
						}
						s.Stack = ps.StackIndex()
						s.Frames = frames
						s.Timestamps = ps.TimestampsUnixNano()
						s.Events = max(int64(s.Timestamps.Len()), 1)
						s.Value = 0
						if ps.Values().Len() == 0 {
							s.Value = int64(s.Timestamps.Len())
						}
						for _, v := range ps.Values().All() {
							s.Value += v
						}
						s.Attrs = r.attrs(ps.AttributeIndices(), s.Attrs[:0])
						if !yield(&s) {
							return
						}
					}
				}
			}
		}
	}
}

func (r *Reader) attrs(indices pcommon.Int32Slice, dst []Attr) []Attr {
	at := r.dict.AttributeTable()
	for _, ai := range indices.All() {
		if ai < 0 || int(ai) >= at.Len() {
			r.Invalid++
			continue
		}
		a := at.At(int(ai))
		dst = append(dst, Attr{Key: r.Str(a.KeyStrindex()), Value: a.Value().AsString()})
	}
	return dst
}

// Stack returns the frames of dictionary stack si, leaf first; false (and
// counted) when si is out of range.
func (r *Reader) Stack(si int32) ([]Frame, bool) {
	if f, ok := r.stacks[si]; ok {
		return f, true
	}
	st := r.dict.StackTable()
	if si < 0 || int(si) >= st.Len() {
		r.Invalid++
		return nil, false
	}
	var frames []Frame
	for _, li := range st.At(int(si)).LocationIndices().All() {
		frames = append(frames, r.location(li)...)
	}
	r.stacks[si] = frames
	return frames, true
}

func (r *Reader) location(li int32) []Frame {
	if f, ok := r.locs[li]; ok {
		return f
	}
	lt := r.dict.LocationTable()
	if li < 0 || int(li) >= lt.Len() {
		r.Invalid++
		return nil
	}
	loc := lt.At(int(li))
	base := Frame{Address: loc.Address(), Location: li}
	for _, a := range r.attrs(loc.AttributeIndices(), nil) {
		if a.Key == AttrFrameType {
			base.Type = a.Value
		}
	}
	if mi := loc.MappingIndex(); mi != 0 {
		mt := r.dict.MappingTable()
		if mi < 0 || int(mi) >= mt.Len() {
			r.Invalid++
		} else {
			base.Mapping = r.Str(mt.At(int(mi)).FilenameStrindex())
		}
	}
	var frames []Frame
	ft := r.dict.FunctionTable()
	for _, ln := range loc.Lines().All() {
		fi := ln.FunctionIndex()
		if fi == 0 {
			continue
		}
		if fi < 0 || int(fi) >= ft.Len() {
			r.Invalid++
			continue
		}
		fn := ft.At(int(fi))
		f := base
		f.Function = r.Str(fn.NameStrindex())
		f.SystemName = r.Str(fn.SystemNameStrindex())
		f.File = r.Str(fn.FilenameStrindex())
		f.Line = ln.Line()
		frames = append(frames, f)
	}
	if len(frames) == 0 {
		frames = append(frames, base)
	}
	r.locs[li] = frames
	return frames
}
