package profile

import (
	"hash/maphash"
	"slices"
	"unsafe"
)

// Repeated stacks. A caller that can say, before it resolves a sample,
// which words determine the sample's resource and frames (a process's
// identity and its raw frame words) hands the builder those words as a key:
// AddKeyed adds a resolved sample and remembers its key; AddKnown adds a
// later sample with the same key without its frames, as a lookup and a
// count (Known finds the key's entry). The builder compares the full key, never a hash alone; what the
// key must hold for the frames to be the same is the caller's to decide.

// keyEntry is a key AddKeyed remembered: its words, and the resource and
// stack of the sample added with it.
type keyEntry struct {
	words     span
	resource  int32
	stack     int32
	next      int32 // the next entry with the same hash; -1 ends
	truncated bool  // the stack was cut to MaxFrames
	aux       uint32
}

// MaxKeyWords bounds the key words a Builder remembers per interval (8
// MiB); past it AddKeyed adds without remembering, and counts
// Stats.Unkeyed.
const MaxKeyWords = 1 << 20

// hashKey hashes key's words.
func (b *Builder) hashKey(key []uint64) uint64 {
	if len(key) == 0 {
		return maphash.Bytes(b.keySeed, nil)
	}
	return maphash.Bytes(b.keySeed, unsafe.Slice((*byte)(unsafe.Pointer(&key[0])), 8*len(key)))
}

// findKey returns the entry remembered for key, or -1.
func (b *Builder) findKey(h uint64, key []uint64) int32 {
	i, ok := b.keyIdx[h]
	if !ok {
		return -1
	}
	for ; i >= 0; i = b.keys[i].next {
		e := &b.keys[i]
		if slices.Equal(b.keyWords[e.words.start:e.words.end], key) {
			return i
		}
	}
	return -1
}

// Known is a key's entry in the interval (Builder.Known).
type Known struct {
	entry int32
	// Aux is what AddKeyed was given with the key.
	Aux uint32
}

// Known looks key up among the keys AddKeyed remembered this interval.
func (b *Builder) Known(key []uint64) (k Known, ok bool) {
	i := b.findKey(b.hashKey(key), key)
	if i < 0 {
		return Known{}, false
	}
	return Known{entry: i, Aux: b.keys[i].aux}, true
}

// AddKnown adds s as Add would if its Resource and Frames were those of
// the sample AddKeyed added with k's key; s.Resource and s.Frames are not
// read. k must come from Known since the last Flush or Discard. It does not
// allocate once the sample (resource, stack, kind, thread, CPU) is known,
// but to grow the interval's events.
func (b *Builder) AddKnown(k Known, s Sample) {
	e := &b.keys[k.entry]
	if s.Kind >= numKinds {
		b.stats.Invalid++
		return
	}
	if len(b.events) >= b.maxSamples {
		b.stats.Dropped++
		return
	}
	if e.truncated {
		b.stats.Truncated++
	}
	b.addEvent(e.resource, e.stack, &s)
	b.stats.Repeated++
}

// AddKeyed is Add, and remembers key as standing for s's resource and
// frames until the interval ends, with aux for AddKnown to return. A key
// already remembered keeps its first entry. It reports false when the
// interval holds MaxKeyWords already (counted in Stats.Unkeyed) or s was
// not added (invalid, or the interval is full).
func (b *Builder) AddKeyed(key []uint64, aux uint32, s Sample) bool {
	res, stack, truncated, ok := b.add(&s)
	if !ok {
		return false
	}
	h := b.hashKey(key)
	if b.findKey(h, key) >= 0 {
		return true
	}
	if len(b.keyWords)+len(key) > MaxKeyWords {
		b.stats.Unkeyed++
		return false
	}
	start := int32(len(b.keyWords))
	b.keyWords = append(b.keyWords, key...)
	next, chained := b.keyIdx[h]
	if !chained {
		next = -1
	}
	b.keyIdx[h] = int32(len(b.keys))
	b.keys = append(b.keys, keyEntry{words: span{start, int32(len(b.keyWords))}, resource: res, stack: stack,
		next: next, truncated: truncated, aux: aux})
	return true
}
