package ruby

import (
	"errors"
	"fmt"
)

// Layout is where one CRuby minor version keeps what the frame walker
// follows and the namer reads. Offsets are in bytes.
type Layout struct {
	Major, Minor int

	VMMainThread int64 // rb_vm_t.ractor.main_thread

	ThreadEC int64 // rb_thread_t.ec
	// ThreadNT is rb_thread_t.nt, the native thread (3.2 and later), 0
	// where the thread holds its thread_id itself. ThreadID is thread_id
	// (pthread_self(), the thread pointer) in whichever holds it.
	ThreadNT int64
	ThreadID int64

	ECVMStack     int64 // rb_execution_context_t.vm_stack
	ECVMStackSize int64 // .vm_stack_size (in words)
	ECCFP         int64 // .cfp: the innermost control frame
	ECThread      int64 // .thread_ptr

	CFPSize int64 // sizeof(rb_control_frame_t): frames are an array, callers above
	CFPPC   int64 // rb_control_frame_t.pc
	CFPIseq int64 // .iseq
	CFPEP   int64 // .ep: ep[0] holds the frame's flags (VM_ENV_DATA_INDEX_FLAGS)

	IseqBody int64 // rb_iseq_t.body

	BodyIseqSize  int64 // rb_iseq_constant_body.iseq_size (uint32, words)
	BodyEncoded   int64 // .iseq_encoded
	BodyPath      int64 // .location.pathobj (String or [path, realpath])
	BodyLabel     int64 // .location.label (String)
	BodyFirstLine int64 // .location.first_lineno (a Fixnum; an int where FirstLineInt)
	FirstLineInt  bool
	BodyInsns     int64 // .insns_info.body (iseq_insn_info_entry[])
	BodyInsnsSize int64 // .insns_info.size (uint32)
	BodySuccTable int64 // .insns_info.succ_index_table

	InsnInfoSize int64 // sizeof(struct iseq_insn_info_entry); line_no first

	// RString and RArray: flags word first. A String's length is in its
	// flags while embedded up to 3.1 (StrEmbedShift, StrEmbedMask), in a
	// field whether embedded or not from 3.2 (StrLen: as.embed.len and
	// as.heap.len share a place in 3.2, len is RString's own from 3.3).
	StrNoEmbed     uint64 // RSTRING_NOEMBED in flags
	StrEmbedShift  uint   // RSTRING_EMBED_LEN_SHIFT
	StrEmbedMask   uint64 // RSTRING_EMBED_LEN_MASK >> shift
	StrLen         int64  // the length of any String; 0: StrHeapLen, or the flags
	StrEmbedAry    int64  // as.embed.ary
	StrHeapLen     int64  // as.heap.len
	StrHeapPtr     int64  // as.heap.ptr
	ArrEmbed       uint64 // RARRAY_EMBED_FLAG
	ArrEmbedAry    int64  // as.ary
	ArrHeapPtr     int64  // as.heap.ptr
	ArrEmbedShift  uint   // RARRAY_EMBED_LEN_SHIFT
	ArrEmbedMask   uint64 // RARRAY_EMBED_LEN_MASK >> shift
	ArrHeapLen     int64  // as.heap.len
	ImemoTypeShift uint   // imemo type: (flags >> shift) & 15

	MEOwner    int64  // rb_method_entry_t.owner: the class or module that defines the method
	BasicKlass int64  // RBasic.klass: a class's metaclass
	Singleton  uint64 // FL_SINGLETON: a metaclass or singleton class (FL_USER0, FL_USER1 from 3.4)
	// A class's rb_classext_t is at RClass.ptr up to 3.1, and from 3.2
	// right after the RClass (ClassExtInline: ClassExt is its offset).
	ClassExt       int64
	ClassExtInline bool
	// Where the ext keeps the class's name and a singleton class's object:
	// up to 3.1 as instance variables in iv_tbl (an st_table *; the
	// __classpath__ and __attached__ IDs are found per process), from 3.3
	// in fields of their own (ExtClassPath, ExtAttached). 3.2 keeps them
	// as instance variables laid out by object shapes, which the namer
	// does not read: its methods are named without their class.
	ExtIVTbl     int64
	ExtClassPath int64
	ExtAttached  int64
	StNum        int64 // st_table.num_entries
	StStart      int64 // .entries_start
	StBound      int64 // .entries_bound
	StEntries    int64 // .entries (st_table_entry[]: hash, key, record)
	StEntrySize  int64

	// Untested: written from the version's published sources, never run
	// against a real Ruby on this project's hosts.
	Untested bool
}

// Value tags and frame flags, the same in every 3.x.
const (
	tMask       = 0x1f
	tString     = 0x05
	tArray      = 0x07
	tImemo      = 0x1a
	imemoIseq   = 7
	frameMagic  = 0x7fff0001 // VM_FRAME_MAGIC_MASK
	magicCFunc  = 0x55550001 // VM_FRAME_MAGIC_CFUNC
	magicIFunc  = 0x66660001 // VM_FRAME_MAGIC_IFUNC
	magicDummy  = 0x79990001 // VM_FRAME_MAGIC_DUMMY
	flagFinish  = 0x0020     // VM_FRAME_FLAG_FINISH: the VM loop returns when this frame does
	flagCFrame  = 0x0080     // VM_FRAME_FLAG_CFRAME: a C function's frame, no iseq
	magicMethod = 0x11110001 // VM_FRAME_MAGIC_METHOD: ep[-2] is its method entry
	imemoMent   = 6          // imemo_ment: a method entry
	tClass      = 0x02
	tModule     = 0x03
)

// A frame's word as the walker reports it: the instruction's position in
// its iseq (posBits, all ones: unknown), a check of the iseq's body address
// (checkBits: bits 4 and up of the malloc'd body, which a freed and reused
// iseq object changes) and a method frame's method entry as its distance
// from the iseq in words (a signed 32 bits, 0: none or too far).
const (
	posBits    = 16
	checkBits  = 16
	PosUnknown = 1<<posBits - 1
)

// Word packs a frame's position, its iseq's body and its method entry as
// the walker does.
func Word(pos, body, me, iseq uint64) uint64 {
	if pos > PosUnknown {
		pos = PosUnknown
	}
	var d uint64
	if me != 0 && me&7 == 0 && iseq&7 == 0 {
		delta := (int64(me) - int64(iseq)) / 8
		if delta >= -1<<31 && delta < 1<<31 {
			d = uint64(uint32(int32(delta)))
		}
	}
	return pos<<(64-posBits) | (body>>4)&(1<<checkBits-1)<<32 | d
}

// SplitWord is Word's inverse for a frame of iseq: the position, the body
// check, and the method entry (0: none).
func SplitWord(w, iseq uint64) (pos, check, me uint64) {
	pos = w >> (64 - posBits)
	check = (w >> 32) & (1<<checkBits - 1)
	if d := int64(int32(uint32(w))); d != 0 {
		me = uint64(int64(iseq) + d*8)
	}
	return pos, check, me
}

// bodyCheck is Word's check of a body address.
func bodyCheck(body uint64) uint64 { return (body >> 4) & (1<<checkBits - 1) }

// layouts are the versions this package knows, by major*100+minor.
var layouts = map[int]Layout{
	300: ruby3(0), 301: ruby3(1), 302: ruby3(2), 303: ruby3(3), 304: ruby3(4),
}

// ruby3 returns Ruby 3.minor's layout (64-bit, VM_DEBUG_BP_CHECK off,
// RVARGC as each release builds by default). 3.1's is read from ruby
// v3_1_2's vm_core.h, iseq.h and iseq.c and run by the tests against
// Debian 12's ruby3.1; 3.3's is run by them against Debian 13's ruby3.3.
// 3.0, 3.2 and 3.4 are untested. The offsets where they differ
// from 3.1 were measured (offsetof) on the structures rbspy generates with
// bindgen from each release's headers, every patch release of a minor
// agreeing, and that measure of 3.1 gives every offset below; the flag
// bits are from the releases' headers.
func ruby3(minor int) Layout {
	l := Layout{Major: 3, Minor: minor, Untested: minor != 1 && minor != 3,
		VMMainThread: 40,
		ThreadEC:     40, ThreadID: 80,
		ECVMStack: 0, ECVMStackSize: 8, ECCFP: 16, ECThread: 48,
		CFPSize: 64, CFPPC: 0, CFPIseq: 16, CFPEP: 32,
		IseqBody:     16,
		BodyIseqSize: 4, BodyEncoded: 8, BodyPath: 64, BodyLabel: 80, BodyFirstLine: 88,
		BodyInsns: 120, BodyInsnsSize: 136, BodySuccTable: 144,
		InsnInfoSize: 12,
		StrNoEmbed:   1 << 13, StrEmbedShift: 14, StrEmbedMask: 0x1f, StrEmbedAry: 16, StrHeapLen: 16, StrHeapPtr: 24,
		ArrEmbed: 1 << 13, ArrEmbedAry: 16, ArrHeapPtr: 32, ArrEmbedShift: 15, ArrEmbedMask: 3, ArrHeapLen: 16,
		ImemoTypeShift: 12,
		MEOwner:        32, BasicKlass: 8, Singleton: 1 << 12, ClassExt: 24, ExtIVTbl: 8,
		StNum: 16, StStart: 32, StBound: 40, StEntries: 48, StEntrySize: 24}
	if minor == 0 {
		// Control frames without jit_return, line entries without node_id.
		l.ECThread, l.CFPSize, l.InsnInfoSize = 56, 56, 8
	}
	if minor >= 2 {
		// A thread's native thread holds its thread_id; first_lineno is
		// an int; the iseq body lost a word before insns_info.
		l.ThreadEC, l.ThreadNT, l.ThreadID = 48, 40, 8
		l.FirstLineInt = true
		l.BodyInsns, l.BodyInsnsSize, l.BodySuccTable = 112, 128, 136
		// Variable-width allocation: a String's length in a field, an
		// Array's embedded length in seven flag bits. Class names are
		// not read (see ExtIVTbl).
		l.StrLen, l.StrEmbedAry, l.StrEmbedShift, l.StrEmbedMask = 16, 24, 0, 0
		l.ArrEmbedMask = 0x7f
		l.ClassExt, l.ExtIVTbl = 0, 0
	}
	if minor >= 3 {
		l.ThreadID, l.CFPSize = 16, 56
		l.ClassExt, l.ClassExtInline, l.ExtClassPath, l.ExtAttached = 32, true, 120, 96
	}
	if minor >= 4 {
		l.Singleton = 1 << 13
	}
	return l
}

// ErrUnknownVersion is matched by the error for a Ruby whose version has
// no layout: its processes keep native stacks.
var ErrUnknownVersion = errors.New("unsupported ruby version")

// LayoutFunc returns the layout of Ruby major.minor, or an error matching
// ErrUnknownVersion.
type LayoutFunc func(major, minor int) (Layout, error)

// LayoutFor returns the table's layout of Ruby major.minor.
func LayoutFor(major, minor int) (Layout, error) {
	l, ok := layouts[major*100+minor]
	if !ok {
		return Layout{}, fmt.Errorf("ruby %d.%d: %w", major, minor, ErrUnknownVersion)
	}
	return l, nil
}
