package profile

import (
	"strconv"
	"time"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/sonde-dev/sonde/internal/symbolize"
)

// FrameType says which runtime or unwinder produced a frame. It becomes the
// location attribute profile.frame.type.
type FrameType uint8

const (
	// FrameUnknown is the zero value: the location gets no
	// profile.frame.type attribute.
	FrameUnknown FrameType = iota
	// FrameKernel is a kernel frame; its address is a kernel address.
	FrameKernel
	// FrameNative is a user-space frame of native code (C, C++, Rust, ...).
	FrameNative
	// FrameGo is a user-space frame of Go code.
	FrameGo
	// FrameRust is a user-space frame of Rust code (named from a symbol
	// mangled as Rust mangles).
	FrameRust
	// FrameCPython is a Python function run by CPython; its address is
	// its code object's.
	FrameCPython
	// FrameJVM is Java code run by a HotSpot JVM (interpreted, compiled,
	// or a code blob of the JVM's own); its address is the Method*
	// (interpreted) or the code blob's.
	FrameJVM
	// FrameV8JS is JavaScript run by V8 (Node.js): interpreted, baseline,
	// Maglev, TurboFan, or a builtin or stub frame of V8's own; its
	// address is the SharedFunctionInfo's (JavaScript frames) or the pc
	// (stub frames).
	FrameV8JS
	// FramePHP is PHP run by the Zend Engine: a user function, method,
	// closure or file's top-level code, or an internal function (C) PHP
	// called; its address is the zend_function's.
	FramePHP
	// FrameRuby is Ruby run by CRuby's VM: a method, block, class body or
	// file's top-level code; its address is the instruction sequence's.
	FrameRuby
	// FramePerl is Perl 5 code: a sub, an eval, a required file's or the
	// program's top-level code; its address is the sub's CV, else the
	// frame's current statement (COP).
	FramePerl
)

// String returns the value written to profile.frame.type ("kernel",
// "native", "go", "rust", "cpython", "jvm", "v8js", "php", "ruby", "perl"), or "" for FrameUnknown and values out of range.
func (t FrameType) String() string {
	switch t {
	case FrameKernel:
		return "kernel"
	case FrameNative:
		return "native"
	case FrameGo:
		return "go"
	case FrameRust:
		return "rust"
	case FrameCPython:
		return "cpython"
	case FrameJVM:
		return "jvm"
	case FrameV8JS:
		return "v8js"
	case FramePHP:
		return "php"
	case FrameRuby:
		return "ruby"
	case FramePerl:
		return "perl"
	}
	return ""
}

// Kind is what a sample measures. Each kind becomes its own Profile within
// the ScopeProfiles of a process.
type Kind uint8

const (
	// OnCPU samples come from the periodic CPU clock; each counts 1.
	OnCPU Kind = iota
	// OffCPU samples measure time a thread spent off the CPU, in nanoseconds.
	OffCPU

	numKinds = 2
)

// String returns "on_cpu", "off_cpu" or "kind(N)" for unknown values.
func (k Kind) String() string {
	switch k {
	case OnCPU:
		return "on_cpu"
	case OffCPU:
		return "off_cpu"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Line is one source position of a frame: the symbolizer's Line, so its
// results go into samples without a copy. A frame with inlined calls has one
// Line per inline level, innermost first.
type Line = symbolize.Line

// Mapping describes the file mapped at [Start, Limit) in a process. Mappings
// are compared by content: two pointers to equal Mappings are one dictionary
// entry.
type Mapping struct {
	Start, Limit, Offset uint64
	File                 string
	GNUBuildID           string // hex; process.executable.build_id.gnu
	GoBuildID            string // process.executable.build_id.go
	FileID               string // Sonde's content-derived file id; process.executable.build_id.htlhash
}

// Frame is one frame of a stack.
type Frame struct {
	Type    FrameType
	Address uint64   // the PC as the process saw it (kernel: the kernel address)
	Mapping *Mapping // nil when unknown; the builder never writes through it
	Lines   []Line   // innermost first; empty when unnamed
	// FramePointer marks a frame found by the frame-pointer walk because no
	// unwind table covered its callee yet; such a frame may be wrong.
	FramePointer bool
	// Tier says how a runtime ran the frame's code ("interpreted", "c1",
	// "c2", ...); it becomes the location attribute sonde.frame.tier.
	// Inlined levels are the Lines before the last.
	Tier string
}

// Resource identifies the process a sample belongs to. The builder groups
// samples by the content of the Resource (PID and every field), not by pointer,
// and copies what it keeps, so the caller may reuse or change it after Add.
type Resource struct {
	PID            int64
	ExecutableName string
	ExecutablePath string
	ContainerID    string
	ServiceName    string
	EnvVars        map[string]string // name -> value
	// CommandLine becomes process.command_line when not empty.
	CommandLine string
	// NamespacePID is the PID inside the process's own PID namespace; it
	// becomes sonde.process.namespace_pid when not 0.
	NamespacePID int64
}

// Sample is one sample event.
type Sample struct {
	Kind Kind
	// Resource is the process; nil stands for an unknown process and is
	// grouped with an empty Resource (PID 0).
	Resource   *Resource
	TID        int64
	ThreadName string
	CPU        int64
	Time       time.Time
	// Value is 1 for on-CPU samples (0 is taken as 1), nanoseconds for
	// off-CPU samples.
	Value  int64
	Frames []Frame // leaf first
}

// Options configures a Builder.
type Options struct {
	// SamplesPerSecond is the on-CPU sampling frequency; the on-CPU period is
	// 1e9/SamplesPerSecond nanoseconds (0 when SamplesPerSecond <= 0).
	SamplesPerSecond int
	// ScopeVersion is written as the instrumentation scope version.
	ScopeVersion string
	// MaxSamples bounds the sample events kept per interval; Add drops and
	// counts events beyond it. 0 means DefaultMaxSamples.
	MaxSamples int
	// MaxFrames bounds the frames kept per sample (the leaf side is kept);
	// longer stacks are cut and counted. 0 means DefaultMaxFrames.
	MaxFrames int
}

const (
	// DefaultMaxSamples is the default bound on sample events per interval:
	// 499 Hz on 100 CPUs for 5 s, about 6 MiB of event records.
	DefaultMaxSamples = 1 << 18
	// DefaultMaxFrames is the default bound on frames per sample, well above
	// what the tracer unwinds (kernel plus 256 user frames).
	DefaultMaxFrames = 1024
)

// Stats are counters since NewBuilder; they only grow.
type Stats struct {
	Added     uint64 // sample events accepted
	Dropped   uint64 // events dropped because the interval held MaxSamples
	Invalid   uint64 // events dropped because their Kind is unknown
	Truncated uint64 // events whose stack was cut to MaxFrames
	// Repeated counts the events added by AddKnown: a stack seen before in
	// their interval, added without its frames.
	Repeated uint64
	// Unkeyed counts the keys AddKeyed could not remember: the interval
	// held MaxKeyWords key words already.
	Unkeyed uint64
}

// Attribute keys and value types of the output contract.
const (
	ScopeName = "github.com/sonde-dev/sonde"

	// SchemaURL is the semantic conventions version whose attribute names
	// the output uses (a test checks each name against it), set on every
	// ResourceProfiles and ScopeProfiles.
	SchemaURL = semconv.SchemaURL

	attrPID          = "process.pid"
	attrExeName      = "process.executable.name"
	attrExePath      = "process.executable.path"
	attrContainerID  = "container.id"
	attrServiceName  = "service.name"
	attrEnvVarPrefix = "process.environment_variable."
	attrCommandLine  = "process.command_line"
	// attrNamespacePID is Sonde's own resource attribute: the process's PID
	// in its own (container's) PID namespace, where process.pid is the
	// host's.
	attrNamespacePID = "sonde.process.namespace_pid"

	attrThreadID   = "thread.id"
	attrThreadName = "thread.name"
	attrCPU        = "cpu.logical_number"

	attrFrameType = "profile.frame.type"
	// attrUnwinder is Sonde's own location attribute: "frame_pointer" on
	// frames the frame-pointer fallback found.
	attrUnwinder         = "sonde.frame.unwinder"
	unwinderFramePointer = "frame_pointer"
	// attrTier is Sonde's location attribute for how a runtime ran a
	// frame's code (Frame.Tier).
	attrTier = "sonde.frame.tier"

	attrBuildIDGNU = "process.executable.build_id.gnu"
	attrBuildIDGo  = "process.executable.build_id.go"
	attrFileID     = "process.executable.build_id.htlhash"
)
