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
// count. The builder compares the full key, never a hash alone; what the
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

// AddKnown adds s as Add would if its Resource and Frames were those of
// the sample AddKeyed added with key in this interval; s.Resource and
// s.Frames are not read. It reports false, adding nothing, when the
// interval holds no such key; else aux is what AddKeyed was given. It does
// not allocate once the sample (resource, stack, kind, thread, CPU) is
// known, but to grow the interval's events.
func (b *Builder) AddKnown(key []uint64, s Sample) (aux uint32, ok bool) {
	i := b.findKey(b.hashKey(key), key)
	if i < 0 {
		return 0, false
	}
	e := &b.keys[i]
	if s.Kind >= numKinds {
		b.stats.Invalid++
		return e.aux, true
	}
	if len(b.events) >= b.maxSamples {
		b.stats.Dropped++
		return e.aux, true
	}
	if e.truncated {
		b.stats.Truncated++
	}
	b.addEvent(e.resource, e.stack, &s)
	b.stats.Repeated++
	return e.aux, true
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
