package process

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestTableAttribution covers what the table reads for resource attributes
// (service name, chosen variables, command line, namespace PID) from a fake
// procfs: which options turn what on, the read bounds, and files that are
// unreadable or malformed, which leave a detail out but never the process.
func TestTableAttribution(t *testing.T) {
	maps := mapsText(textInit)
	// A variable past the environ read bound is not seen; the one cut in
	// half by the bound is dropped, not kept partly.
	filler := "FILLER=" + strings.Repeat("f", maxEnvironLen-len("FILLER=")-len("EARLY=1\x00")-5)
	bigEnviron := "EARLY=1\x00" + filler + "\x00CUT=abcdefgh\x00LATE=1\x00"
	longArg := strings.Repeat("a", maxCommandLineLen)

	type want struct {
		service      string
		env          map[string]string
		cmdline      string
		nsPID        int
		malformedAdd uint64
	}
	tests := []struct {
		name  string
		opts  Options
		proc  fakeProc
		setup func(fs *fakeProcfs)
		want  want
	}{
		{
			name: "every option on",
			opts: Options{EnvVars: []string{"DEPLOY", "REGION", "UNSET"}, CommandLine: true},
			proc: fakeProc{environ: "OTEL_SERVICE_NAME=cart\x00DEPLOY=blue\x00REGION=eu\x00",
				cmdline: "/bin/app\x00-c\x00/etc/app.conf\x00", nspid: []int{12}},
			want: want{service: "cart", env: map[string]string{"DEPLOY": "blue", "REGION": "eu"},
				cmdline: "/bin/app -c /etc/app.conf", nsPID: 12},
		},
		{
			name: "options off: service name and namespace PID only",
			proc: fakeProc{environ: "OTEL_SERVICE_NAME=cart\x00DEPLOY=blue\x00", cmdline: "/bin/app\x00", nspid: []int{12}},
			want: want{service: "cart", nsPID: 12},
		},
		{
			name: "nested PID namespaces: the innermost PID",
			proc: fakeProc{nspid: []int{300, 7}},
			want: want{nsPID: 7},
		},
		{
			name: "namespace PID equal to the host PID is kept",
			proc: fakeProc{nspid: []int{100}},
			want: want{nsPID: 100},
		},
		{
			name: "service from OTEL_RESOURCE_ATTRIBUTES",
			proc: fakeProc{environ: "OTEL_RESOURCE_ATTRIBUTES=service.name=cart%2Fv2,team=a\x00"},
			want: want{service: "cart/v2"},
		},
		{
			name: "malformed OTEL_RESOURCE_ATTRIBUTES is discarded and counted",
			opts: Options{EnvVars: []string{"OTEL_RESOURCE_ATTRIBUTES"}},
			proc: fakeProc{environ: "OTEL_RESOURCE_ATTRIBUTES=service.name=cart,broken\x00"},
			want: want{env: map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "service.name=cart,broken"}, malformedAdd: 1},
		},
		{
			name: "malformed NSpid is left out and counted",
			proc: fakeProc{environ: "OTEL_SERVICE_NAME=cart\x00"},
			setup: func(fs *fakeProcfs) {
				fs.write(100, "status", "Name:\tapp\nNSpid:\t100\tlots\n")
			},
			want: want{service: "cart", malformedAdd: 1},
		},
		{
			name:  "old kernel without NSpid",
			proc:  fakeProc{nspid: []int{12}},
			setup: func(fs *fakeProcfs) { fs.write(100, "status", "Name:\tapp\nPid:\t100\n") },
			want:  want{},
		},
		{
			name: "environ past the read bound",
			opts: Options{EnvVars: []string{"EARLY", "CUT", "LATE"}},
			proc: fakeProc{environ: bigEnviron},
			want: want{env: map[string]string{"EARLY": "1"}},
		},
		{
			name: "command line cut at the bound",
			opts: Options{CommandLine: true},
			proc: fakeProc{cmdline: "/bin/app\x00" + longArg + "\x00"},
			want: want{cmdline: ("/bin/app " + longArg)[:maxCommandLineLen]},
		},
		{
			// A directory in place of a file reads with EISDIR, an error
			// other than "gone", like EACCES for an agent without
			// CAP_SYS_PTRACE.
			name: "unreadable environ, cmdline and status",
			opts: Options{EnvVars: []string{"DEPLOY"}, CommandLine: true},
			proc: fakeProc{environ: "OTEL_SERVICE_NAME=cart\x00DEPLOY=blue\x00", cmdline: "/bin/app\x00", nspid: []int{12}},
			setup: func(fs *fakeProcfs) {
				for _, name := range []string{"environ", "cmdline", "status"} {
					fs.remove(100, name)
					fs.write(100, name+"/x", "")
				}
			},
			want: want{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newFakeProcfs(t)
			p := tt.proc
			p.pid, p.ppid, p.comm, p.start, p.exe, p.maps = 100, 1, "app", 500, "/bin/app", maps
			fs.add(p)
			if tt.setup != nil {
				tt.setup(fs)
			}
			tab, _ := newTestTable(t, fs, tt.opts)
			got, err := tab.Get(100)
			if err != nil {
				t.Fatalf("Get() = %v", err)
			}
			if len(got.Mappings) != 1 || got.ExePath != "/bin/app" {
				t.Errorf("Get() = %+v, want the process read whole", got)
			}
			g := want{service: got.ServiceName, env: got.Env, cmdline: got.CommandLine, nsPID: got.NamespacePID,
				malformedAdd: tab.Stats().Malformed}
			if diff := cmp.Diff(tt.want, g, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("attribution mismatch (-want +got):\n%s", diff)
			}
			if s := tab.Stats(); s.Errors != 0 || s.Gone != 0 {
				t.Errorf("Stats() = %+v, want no errors: a detail left out is not a failed read", s)
			}
		})
	}
}
