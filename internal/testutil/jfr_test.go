package testutil

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// jfrDoc is `jfr print --json` output in the shape JDK 17 and 25 print it,
// trimmed to two events: a two-frame sample and an event of another type.
const jfrDoc = `{
  "recording": {
    "events": [{
      "type": "jdk.ExecutionSample",
      "values": {
        "startTime": "2026-11-27T04:00:58.626512245Z",
        "sampledThread": {"osName": "main", "osThreadId": 17722, "javaName": "main", "javaThreadId": 3, "virtual": false},
        "stackTrace": {
          "truncated": true,
          "frames": [{
            "method": {
              "type": {"classLoader": {"type": null, "name": "app"}, "name": "com\/example\/Outer$Inner", "package": {"name": "com\/example"}, "modifiers": 17, "hidden": false},
              "name": "jGammaBurn", "descriptor": "(J)J", "modifiers": 8, "hidden": false
            },
            "lineNumber": 44, "bytecodeIndex": 12, "type": "JIT compiled"
          }, {
            "method": {
              "type": {"name": "JBurn"},
              "name": "main", "descriptor": "([Ljava\/lang\/String;)V"
            },
            "lineNumber": 20, "bytecodeIndex": 40, "type": "Interpreted"
          }]
        }
      }
    }, {
      "type": "jdk.Deoptimization",
      "values": {"startTime": "2026-11-27T04:00:59Z"}
    }]
  }
}`

func TestParseJFRJSON(t *testing.T) {
	got, err := ParseJFRJSON(strings.NewReader(jfrDoc))
	if err != nil {
		t.Fatal(err)
	}
	want := []JFRSample{{
		Time:      time.Date(2026, 11, 27, 4, 0, 58, 626512245, time.UTC),
		TID:       17722,
		Thread:    "main",
		Truncated: true,
		Frames: []JFRFrame{
			{Class: "com.example.Outer$Inner", Method: "jGammaBurn", Descriptor: "(J)J", Line: 44, BCI: 12, Type: "JIT compiled"},
			{Class: "JBurn", Method: "main", Descriptor: "([Ljava/lang/String;)V", Line: 20, BCI: 40, Type: "Interpreted"},
		},
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseJFRJSON (-want +got):\n%s", diff)
	}
	if f := got[0].Frames[0].Function(); f != "com.example.Outer$Inner.jGammaBurn" {
		t.Errorf("Function() = %q", f)
	}
}

// TestParseJFRJSONNoStack: a sample JFR could not walk has no stackTrace;
// it is kept, marked, with its thread and time.
func TestParseJFRJSONNoStack(t *testing.T) {
	doc := `{"recording": {"events": [{"type": "jdk.ExecutionSample", "values": {"startTime": "2026-11-27T04:00:58Z", "sampledThread": {"osName": "main", "osThreadId": 7}, "stackTrace": null}}]}}`
	got, err := ParseJFRJSON(strings.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := []JFRSample{{Time: time.Date(2026, 11, 27, 4, 0, 58, 0, time.UTC), TID: 7, Thread: "main", NoStack: true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseJFRJSON (-want +got):\n%s", diff)
	}
}

// A sample JFR wrote without its thread (a null sampledThread) is kept,
// marked, with no TID.
func TestParseJFRJSONNoThread(t *testing.T) {
	doc := `{"recording": {"events": [{"type": "jdk.ExecutionSample", "values": {"startTime": "2026-11-27T04:00:58Z", "sampledThread": null, "stackTrace": {"frames": []}}}]}}`
	got, err := ParseJFRJSON(strings.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := []JFRSample{{Time: time.Date(2026, 11, 27, 4, 0, 58, 0, time.UTC), NoThread: true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseJFRJSON (-want +got):\n%s", diff)
	}
}

func TestParseJFRJSONErrors(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"not json", `{"recording": [`, "jfr json"},
		{"bad time", `{"recording": {"events": [{"type": "jdk.ExecutionSample", "values": {"startTime": "yesterday", "sampledThread": {"osThreadId": 1}, "stackTrace": {"frames": []}}}]}}`, "start time"},
		{"no method", `{"recording": {"events": [{"type": "jdk.ExecutionSample", "values": {"startTime": "2026-11-27T04:00:58Z", "sampledThread": {"osThreadId": 1}, "stackTrace": {"frames": [{"lineNumber": 3}]}}}]}}`, "frame 0 has no method"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseJFRJSON(strings.NewReader(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}

// FuzzParseJFRJSON: the parser never panics, and every sample it returns
// has named frames.
func FuzzParseJFRJSON(f *testing.F) {
	f.Add(jfrDoc)
	f.Add(`{"recording": {"events": []}}`)
	f.Add(`{"recording": {"events": [{"type": "jdk.ExecutionSample", "values": null}]}}`)
	f.Fuzz(func(t *testing.T, doc string) {
		samples, err := ParseJFRJSON(strings.NewReader(doc))
		if err != nil {
			return
		}
		for _, s := range samples {
			for _, fr := range s.Frames {
				if fr.Class == "" || fr.Method == "" {
					t.Fatalf("unnamed frame %+v", fr)
				}
			}
		}
	})
}
