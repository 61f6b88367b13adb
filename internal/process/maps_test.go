package process

import (
	"bytes"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

func TestParseMaps(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []Mapping
		wantErr string
	}{
		{
			name: "executable file",
			in:   "561ae9608000-561ae960d000 r-xp 00002000 fe:00 247026                     /usr/bin/cat\n",
			want: []Mapping{{Start: 0x561ae9608000, End: 0x561ae960d000, Offset: 0x2000, Perms: "r-xp",
				Dev: unix.Mkdev(0xfe, 0), Inode: 247026, Path: "/usr/bin/cat"}},
		},
		{
			name: "anonymous with trailing space and without",
			in: "7f4d10eb3000-7f4d10ed5000 rw-p 00000000 00:00 0 \n" +
				"7f4d10ed5000-7f4d10ed6000 rw-p 00000000 00:00 0\n",
			want: []Mapping{
				{Start: 0x7f4d10eb3000, End: 0x7f4d10ed5000, Perms: "rw-p"},
				{Start: 0x7f4d10ed5000, End: 0x7f4d10ed6000, Perms: "rw-p"},
			},
		},
		{
			name: "pseudo paths kept",
			in: "558fe4a32000-558fe4a53000 rw-p 00000000 00:00 0                          [heap]\n" +
				"7ffd5a5f0000-7ffd5a5f2000 r-xp 00000000 00:00 0                          [vdso]\n" +
				"ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]\n",
			want: []Mapping{
				{Start: 0x558fe4a32000, End: 0x558fe4a53000, Perms: "rw-p", Path: "[heap]"},
				{Start: 0x7ffd5a5f0000, End: 0x7ffd5a5f2000, Perms: "r-xp", Path: "[vdso]"},
				{Start: 0xffffffffff600000, End: 0xffffffffff601000, Perms: "--xp", Path: "[vsyscall]"},
			},
		},
		{
			name: "deleted file",
			in:   "7f0000000000-7f0000001000 r-xp 00001000 08:01 1234 /tmp/jit code.so (deleted)\n",
			want: []Mapping{{Start: 0x7f0000000000, End: 0x7f0000001000, Offset: 0x1000, Perms: "r-xp",
				Dev: unix.Mkdev(8, 1), Inode: 1234, Path: "/tmp/jit code.so", Deleted: true}},
		},
		{
			name: "memfd",
			in:   "7f0000000000-7f0000001000 r-xs 00000000 00:01 99   /memfd:wasm (deleted)\n",
			want: []Mapping{{Start: 0x7f0000000000, End: 0x7f0000001000, Perms: "r-xs",
				Dev: unix.Mkdev(0, 1), Inode: 99, Path: "/memfd:wasm", Deleted: true}},
		},
		{
			name: "path with spaces and escaped newline",
			in:   "400000-401000 r-xp 00000000 103:02 7 /opt/my app/bin/x  y\\012z\n",
			want: []Mapping{{Start: 0x400000, End: 0x401000, Perms: "r-xp",
				Dev: unix.Mkdev(0x103, 2), Inode: 7, Path: "/opt/my app/bin/x  y\\012z"}},
		},
		{
			name: "empty input",
			in:   "",
			want: nil,
		},
		{name: "missing fields", in: "400000-401000 r-xp 00000000\n", wantErr: "line 1"},
		{name: "no dash", in: "400000 r-xp 00000000 08:01 7 /x\n", wantErr: "address range"},
		{name: "end before start", in: "401000-400000 r-xp 00000000 08:01 7 /x\n", wantErr: "before start"},
		{name: "bad perms", in: "400000-401000 rxp 00000000 08:01 7 /x\n", wantErr: "permissions"},
		{name: "bad perms letter", in: "400000-401000 r-xq 00000000 08:01 7 /x\n", wantErr: "permissions"},
		{name: "bad offset", in: "400000-401000 r-xp 0000g000 08:01 7 /x\n", wantErr: "offset"},
		{name: "hex too long", in: "400000-10000000000000000 r-xp 0 08:01 7 /x\n", wantErr: "end"},
		{name: "bad device", in: "400000-401000 r-xp 0 0801 7 /x\n", wantErr: "device"},
		{name: "device major out of range", in: "400000-401000 r-xp 0 1000:01 7 /x\n", wantErr: "major"},
		{name: "bad inode", in: "400000-401000 r-xp 0 08:01 -7 /x\n", wantErr: "inode"},
		{name: "garbage", in: "\x00\xff garbage\n", wantErr: "line 1"},
		{name: "garbage on line 2", in: "400000-401000 r-xp 0 08:01 7 /x\nnot a mapping\n", wantErr: "line 2"},
		{
			name:    "line longer than the kernel writes",
			in:      "400000-401000 r-xp 0 08:01 7 /" + strings.Repeat("a", maxMapsLineLen) + "\n",
			wantErr: "longer than",
		},
		{
			name:    "too many lines",
			in:      strings.Repeat("400000-401000 r-xp 0 08:01 7 /x\n", maxMapsLines+1),
			wantErr: "more than",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMaps(strings.NewReader(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseMaps() error = %v, want one containing %q", err, tt.wantErr)
				}
				if got != nil {
					t.Errorf("ParseMaps() returned %d mappings with an error, want none", len(got))
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseMaps() error = %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseMaps() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMappingMethods(t *testing.T) {
	m := Mapping{Start: 0x1000, End: 0x3000, Offset: 0x5000, Perms: "r-xp", Path: "/bin/x"}
	if !m.Executable() || !m.FileBacked() {
		t.Errorf("Executable() = %v, FileBacked() = %v, want true, true", m.Executable(), m.FileBacked())
	}
	if got := m.FileOffset(0x1234); got != 0x5234 {
		t.Errorf("FileOffset(0x1234) = %#x, want 0x5234", got)
	}
	for _, n := range []Mapping{{Perms: "rw-p", Path: "[heap]"}, {Perms: ""}} {
		if n.Executable() || n.FileBacked() {
			t.Errorf("%+v: Executable() = %v, FileBacked() = %v, want false, false", n, n.Executable(), n.FileBacked())
		}
	}
}

// TestParseMapsSelf parses the kernel's own output and checks every file
// mapping against stat(2) of its path, an independent source for device and
// inode numbers.
func TestParseMapsSelf(t *testing.T) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Skipf("no procfs: %v", err)
	}
	defer f.Close()
	ms, err := ParseMaps(f)
	if err != nil {
		t.Fatalf("ParseMaps(/proc/self/maps): %v", err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var checked, sawExe int
	for _, m := range ms {
		if !m.FileBacked() || m.Deleted {
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Stat(m.Path, &st); err != nil {
			continue // replaced on disk since it was mapped
		}
		checked++
		if m.Dev != st.Dev || m.Inode != st.Ino {
			t.Errorf("%s: maps says dev %#x inode %d, stat says dev %#x inode %d", m.Path, m.Dev, m.Inode, st.Dev, st.Ino)
		}
		if m.Path == exe && m.Executable() {
			sawExe++
		}
	}
	if checked == 0 || sawExe == 0 {
		t.Errorf("checked %d file mappings, %d executable ones of %s; want some of each", checked, sawExe, exe)
	}
}

func FuzzParseMaps(f *testing.F) {
	f.Add([]byte("561ae9608000-561ae960d000 r-xp 00002000 fe:00 247026                     /usr/bin/cat\n"))
	f.Add([]byte("7f4d10eb3000-7f4d10ed5000 rw-p 00000000 00:00 0 \n7ffd5a5f0000-7ffd5a5f2000 r-xp 00000000 00:00 0  [vdso]\n"))
	f.Add([]byte("7f0000000000-7f0000001000 r-xp 00001000 08:01 1234 /tmp/jit code.so (deleted)\n"))
	f.Add([]byte("400000-401000 r-xp 00000000 103:02 7 /opt/my app/x\\012y\n"))
	f.Add([]byte("401000-400000 r-xp 0 08:01 7 /x"))
	f.Add([]byte("\x00\xff garbage"))
	if b, err := os.ReadFile("/proc/self/maps"); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		ms, err := ParseMaps(bytes.NewReader(in))
		if err != nil {
			if ms != nil {
				t.Fatalf("mappings returned with error %v", err)
			}
			return
		}
		if len(ms) > bytes.Count(in, []byte("\n"))+1 {
			t.Fatalf("%d mappings from %d lines", len(ms), bytes.Count(in, []byte("\n"))+1)
		}
		for _, m := range ms {
			if m.End < m.Start || len(m.Perms) != 4 || strings.HasSuffix(m.Path, " (deleted)") && !m.Deleted {
				t.Fatalf("inconsistent mapping %+v", m)
			}
		}
	})
}
