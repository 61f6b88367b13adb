package ruby

import "testing"

// The code below is Debian 13's libruby-3.3.so.3.3.8 (objdump -d): the
// functions hidden.go reads when the VM's symbols are hidden.
var (
	// ruby_vm_at_exit at 0x271910: mov 0x1fa2bf(%rip),%rbp at 0x271922.
	atExitCode = []byte{
		0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x53, 0x48, 0x89, 0xfb, 0xbf, 0x10, 0x00, 0x00, 0x00,
		0x48, 0x83, 0xec, 0x08, 0x48, 0x8b, 0x2d, 0xbf, 0xa2, 0x1f, 0x00,
	}
	// rb_current_receiver at 0x270400, local-dynamic: lea 0x1ea251(%rip),%rdi;
	// call __tls_get_addr; mov 0x10(%rax),%rax.
	receiverCode = []byte{
		0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x83, 0xec, 0x08,
		0x48, 0x8d, 0x3d, 0x51, 0xa2, 0x1e, 0x00,
		0xe8, 0xec, 0xf2, 0xdc, 0xff,
		0x48, 0x8b, 0x80, 0x10, 0x00, 0x00, 0x00,
	}
	// rb_errinfo at 0xe6f10, general-dynamic: data16 lea 0x373bb0(%rip),%rdi;
	// data16 data16 rex.W call __tls_get_addr; mov (%rax),%rax.
	errinfoCode = []byte{
		0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x83, 0xec, 0x08,
		0x66, 0x48, 0x8d, 0x3d, 0xb0, 0x3b, 0x37, 0x00,
		0x66, 0x66, 0x48, 0xe8, 0xd8, 0x87, 0xf5, 0xff,
		0x48, 0x8b, 0x00, 0x48, 0x8b, 0x40, 0x78,
	}
)

func TestRipLoad(t *testing.T) {
	if got, ok := ripLoad(atExitCode, 0x271910); !ok || got != 0x46bbe8 {
		t.Errorf("ruby_vm_at_exit loads %#x, %v; want 0x46bbe8", got, ok)
	}
	if _, ok := ripLoad(atExitCode[:len(atExitCode)-1], 0x271910); ok {
		t.Error("a load cut short was decoded")
	}
}

func TestTLSAccess(t *testing.T) {
	for _, tt := range []struct {
		name      string
		code      []byte
		at        uint64
		got       uint64
		disp      int64
		wantFound bool
	}{
		{"local-dynamic", receiverCode, 0x270400, 0x45a660, 0x10, true},
		{"general-dynamic", errinfoCode, 0xe6f10, 0x45aad0, 0, true},
		{"no call after the lea", append(append([]byte{}, receiverCode[:15]...), 0x90, 0x90, 0x90, 0x90, 0x90), 0x270400, 0, 0, false},
		{"cut before the load", receiverCode[:22], 0x270400, 0, 0, false},
		{"disp8 load", append(append([]byte{}, receiverCode[:20]...), 0x48, 0x8b, 0x40, 0x18), 0x270400, 0x45a660, 0x18, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, disp, ok := tlsAccess(tt.code, tt.at)
			if ok != tt.wantFound || (ok && (got != tt.got || disp != tt.disp)) {
				t.Errorf("got %#x disp %#x found %v; want %#x %#x %v", got, disp, ok, tt.got, tt.disp, tt.wantFound)
			}
		})
	}
}

// FuzzHiddenCode feeds the decoders any code: they find nothing or an
// address within the code's reach, and never read past it.
func FuzzHiddenCode(f *testing.F) {
	f.Add(atExitCode)
	f.Add(receiverCode)
	f.Add(errinfoCode)
	f.Fuzz(func(t *testing.T, code []byte) {
		const at = 1 << 32
		if a, ok := ripLoad(code, at); ok && (a < at-1<<31 || a > at+uint64(len(code))+1<<31) {
			t.Fatalf("load of %#x out of reach", a)
		}
		if g, d, ok := tlsAccess(code, at); ok && (g < at-1<<31 || g > at+uint64(len(code))+1<<31 || d < -1<<31 || d >= 1<<31) {
			t.Fatalf("tls entry %#x disp %d out of reach", g, d)
		}
	})
}
