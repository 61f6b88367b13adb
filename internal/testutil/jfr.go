package testutil

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The JFR oracle: HotSpot's own sampler (JDK Flight Recorder, event
// jdk.ExecutionSample) walks Java stacks with the VM's knowledge of every
// frame, so its stacks are what a Java profiler must show. A test records
// with -XX:StartFlightRecording and reads the samples back with the JDK's
// jfr tool (`jfr print --json`), through JFRSamples.

// JFRFrame is one frame of a JFR stack trace.
type JFRFrame struct {
	Class      string // binary name with dots: java.util.HashMap, Churn$Circle
	Method     string // jGammaBurn, <init>
	Descriptor string // (J)J
	Line       int64  // from the line number table; 0 or less when unknown
	BCI        int64
	Type       string // Interpreted, JIT compiled, Inlined, Native, C1 compiled
}

// Function is the frame's class and method, as Class.method.
func (f JFRFrame) Function() string { return f.Class + "." + f.Method }

// JFRSample is one jdk.ExecutionSample event.
type JFRSample struct {
	Time      time.Time
	TID       int64 // the sampled thread's OS thread ID
	Thread    string
	Truncated bool       // JFR cut the stack at its depth
	NoStack   bool       // JFR took the sample but could not walk the stack
	NoThread  bool       // JFR wrote the sample without its thread (TID 0)
	Frames    []JFRFrame // leaf first
}

// jfrJSON is the part of `jfr print --json` output the oracle reads.
type jfrJSON struct {
	Recording struct {
		Events []struct {
			Type   string `json:"type"`
			Values struct {
				StartTime     string `json:"startTime"`
				SampledThread *struct {
					OSName     string `json:"osName"`
					OSThreadID int64  `json:"osThreadId"`
				} `json:"sampledThread"`
				StackTrace *struct {
					Truncated bool `json:"truncated"`
					Frames    []struct {
						Method *struct {
							Type *struct {
								Name string `json:"name"`
							} `json:"type"`
							Name       string `json:"name"`
							Descriptor string `json:"descriptor"`
						} `json:"method"`
						LineNumber    int64  `json:"lineNumber"`
						BytecodeIndex int64  `json:"bytecodeIndex"`
						Type          string `json:"type"`
					} `json:"frames"`
				} `json:"stackTrace"`
			} `json:"values"`
		} `json:"events"`
	} `json:"recording"`
}

// ParseJFRJSON reads the jdk.ExecutionSample events of `jfr print --json`
// output; events of other types are skipped. A sample whose stack JFR could
// not walk (no stackTrace) is kept with NoStack set, one JFR wrote without
// its thread (a null sampledThread: the thread's entry missing from the
// recording's constant pool, seen now and then) with NoThread set. A frame
// without a method is an error: the oracle must not silently drop what it
// compares.
func ParseJFRJSON(r io.Reader) ([]JFRSample, error) {
	var doc jfrJSON
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return nil, fmt.Errorf("jfr json: %w", err)
	}
	var out []JFRSample
	for i, ev := range doc.Recording.Events {
		if ev.Type != "jdk.ExecutionSample" {
			continue
		}
		v := ev.Values
		ts, err := time.Parse(time.RFC3339Nano, v.StartTime)
		if err != nil {
			return nil, fmt.Errorf("jfr event %d: start time: %w", i, err)
		}
		s := JFRSample{Time: ts, NoThread: v.SampledThread == nil}
		if v.SampledThread != nil {
			s.TID, s.Thread = v.SampledThread.OSThreadID, v.SampledThread.OSName
		}
		if v.StackTrace == nil {
			s.NoStack = true
			out = append(out, s)
			continue
		}
		s.Truncated = v.StackTrace.Truncated
		for j, f := range v.StackTrace.Frames {
			if f.Method == nil || f.Method.Type == nil || f.Method.Type.Name == "" || f.Method.Name == "" {
				return nil, fmt.Errorf("jfr event %d: frame %d has no method", i, j)
			}
			s.Frames = append(s.Frames, JFRFrame{
				Class:      strings.ReplaceAll(f.Method.Type.Name, "/", "."),
				Method:     f.Method.Name,
				Descriptor: f.Method.Descriptor,
				Line:       f.LineNumber,
				BCI:        f.BytecodeIndex,
				Type:       f.Type,
			})
		}
		out = append(out, s)
	}
	return out, nil
}

// JFRSamples prints the execution samples of the recording file with the
// jfr tool of the JDK at jdk, keeping up to depth frames of each stack (jfr
// print keeps 5 unless told), and parses them.
func JFRSamples(tb testing.TB, jdk, recording string, depth int) []JFRSample {
	tb.Helper()
	cmd := exec.Command(filepath.Join(jdk, "bin", "jfr"), "print", "--json", "--events", "jdk.ExecutionSample",
		"--stack-depth", strconv.Itoa(depth), recording)
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("%s: %v", strings.Join(cmd.Args, " "), err)
	}
	samples, err := ParseJFRJSON(bytes.NewReader(out))
	if err != nil {
		tb.Fatalf("%s: %v", recording, err)
	}
	// JFR records a sample whose stack walk failed without a stack (HotSpot
	// gives up on some frames, a thread in transition among them); such a
	// sample names no frame to compare, so it is left out, and counted. A
	// sample without its thread cannot be compared with any thread's: left
	// out too, and counted; more than one in a hundred and the recording is
	// not an oracle.
	kept := samples[:0]
	noThread := 0
	for _, s := range samples {
		if s.NoThread {
			noThread++
		}
		if !s.NoStack && !s.NoThread {
			kept = append(kept, s)
		}
	}
	if n := len(samples) - len(kept); n > 0 {
		tb.Logf("%s: %d of %d JFR samples have no stack or no thread (%d without a thread); left out", recording, n, len(samples), noThread)
	}
	if noThread > 1 && noThread*100 > len(samples) {
		tb.Fatalf("%s: %d of %d JFR samples have no thread", recording, noThread, len(samples))
	}
	return kept
}
