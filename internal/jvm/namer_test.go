package jvm

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// liveBlob is a code blob found by walking a live code heap.
type liveBlob struct {
	addr   uint64
	hdr    blobHeader
	name   string // for stubs
	method string // for nmethods: the method's function name
	nm     *nmethodInfo
	osr    bool
}

// walkHeaps enumerates the used blocks of every code heap from user space:
// block after block by their header's length, as CodeHeap::next_block
// does. Each blob found is also looked up through the segment map, as the
// eBPF walker does, and must come out at the same address.
func walkHeaps(t *testing.T, vm *VM, mem Memory) []liveBlob {
	t.Helper()
	l := vm.l
	k := vm.Kernel
	hdr, _ := l.t.opt("HeapBlock::_header")
	length, _ := l.t.opt("HeapBlock::Header::_length")
	var out []liveBlob
	for _, h := range k.Heaps {
		block := h.Low
		for block < h.High {
			b := make([]byte, l.heapBlockSize)
			if err := mem.ReadAt(b, block); err != nil {
				break // the end of the committed part
			}
			segs, _ := (off{at: hdr.at + length.at, width: length.width}).get(b)
			if segs == 0 {
				break
			}
			used := b[l.heapBlockUsed] != 0
			blob := block + l.heapBlockSize
			next := block + segs<<h.SegShift
			if used {
				// The segment map leads from the blob's last byte back to it.
				last := next - 1
				i := (last - h.Low) >> h.SegShift
				for {
					var s [1]byte
					if err := mem.ReadAt(s[:], h.Segmap+i); err != nil {
						t.Fatalf("segmap: %v", err)
					}
					if s[0] == 0xFF {
						t.Fatalf("segmap at block %#x: free", block)
					}
					if s[0] == 0 {
						break
					}
					i -= uint64(s[0])
				}
				if got := h.Low + i<<h.SegShift + uint64(k.HeapBlockSize); got != blob {
					t.Errorf("segmap leads %#x to %#x, want %#x", last, got, blob)
				}
				if bh, err := readBlobHeader(mem, l, blob); err == nil {
					lb := liveBlob{addr: blob, hdr: bh}
					if bh.nmethod {
						if nm, err := readNmethod(mem, l, blob, bh); err == nil {
							lb.nm = nm
							if m, err := readMethod(mem, l, nm.method); err == nil {
								lb.method = m.function
							}
							bci, _ := l.nmEntryBCI.get(bh.raw)
							lb.osr = int32(bci) != -1
						}
					} else {
						lb.name, _ = readCString(mem, bh.name, 256)
					}
					out = append(out, lb)
				}
			}
			block = next
		}
	}
	return out
}

// waitCompiled walks the code heaps until an nmethod of function at tier
// (not an OSR one) appears, built. The JIT marks a code heap block used
// when it allocates it, before it copies the nmethod's PcDescs in: one
// seen that early has no PcDesc with a scope yet, and is waited on as one
// not there (a sample's PC is never in it: its code has not run).
func waitCompiled(t *testing.T, vm *VM, mem Memory, function, tier string) (liveBlob, []liveBlob) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		blobs := walkHeaps(t, vm, mem)
		for _, b := range blobs {
			if b.nm != nil && b.method == function && b.nm.tier == tier && !b.osr && hasScope(b.nm) {
				return b, blobs
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s nmethod of %s after 60s among %d blobs", tier, function, len(blobs))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// hasScope says whether any PcDesc of nm has a scope.
func hasScope(nm *nmethodInfo) bool {
	for _, d := range nm.pcs {
		if d.scope != 0 && d.pc >= 0 {
			return true
		}
	}
	return false
}

// TestNamerLive names the frames of a live JVM of each installed JDK: its
// compiled code found by walking the code heaps, its methods as an
// interpreter frame would show them, with lines checked against javap.
func TestNamerLive(t *testing.T) {
	testutil.RequireRoot(t, "reading a JVM's memory")
	for _, j := range installedJDKs(t) {
		t.Run(j.name, func(t *testing.T) {
			dir := compile(t, j, "JBurn")
			lines := javapLines(t, j, dir, "JBurn")
			mixLines := javapLines(t, j, dir, "JBurn$Mix")
			for _, m := range []lineTable{lines["jGammaBurn"], mixLines["step"], mixLines["rotate"]} {
				if len(m.bciLine) == 0 {
					t.Fatalf("javap gave no line table: %v %v", lines, mixLines)
				}
			}
			cmd := startJava(t, j, dir, "JBurn",
				[]string{"-XX:+UnlockDiagnosticVMOptions", "-XX:+DebugNonSafepoints"}, "90")
			pid := cmd.Process.Pid
			vm, mem := findVM(t, pid)
			n := NewNamer("/proc", 64<<20)
			if err := n.Add(pid, vm); err != nil {
				t.Fatal(err)
			}
			defer n.Forget(pid)

			gamma, blobs := waitCompiled(t, vm, mem, "JBurn.jGammaBurn", TierC2)
			id := gamma.hdr.compileID
			word := func(pcOff uint32) uint64 { return uint64(uint32(id))<<32 | uint64(pcOff) }

			// Every PcDesc with a scope names jGammaBurn outermost, with
			// lines javap agrees with.
			known := map[string]lineTable{
				"JBurn.jGammaBurn": lines["jGammaBurn"],
				"JBurn$Mix.step":   mixLines["step"],
				"JBurn$Mix.rotate": mixLines["rotate"],
				"JBurn$Mix.fold":   mixLines["fold"],
			}
			inlined := map[string]bool{}
			named := 0
			for _, d := range gamma.nm.pcs {
				if d.scope == 0 || d.pc < 0 {
					continue
				}
				f, err := n.Frame(pid, FrameCompiled, gamma.addr, word(gamma.nm.codeBegin+uint32(d.pc)), true)
				if err != nil {
					t.Fatalf("frame at pc desc %+v: %v", d, err)
				}
				named++
				if f.Tier != TierC2 {
					t.Errorf("tier %q, want c2", f.Tier)
				}
				outer := f.Lines[len(f.Lines)-1]
				if outer.Function != "JBurn.jGammaBurn" || outer.SystemName != "JBurn.jGammaBurn(I)J" || outer.File != "JBurn.java" {
					t.Fatalf("outermost %+v, want JBurn.jGammaBurn(I)J in JBurn.java", outer)
				}
				for _, ln := range f.Lines {
					lt, ok := known[ln.Function]
					if !ok {
						t.Errorf("pc desc %+v: unexpected method %s", d, ln.Function)
						continue
					}
					if lo, hi := lt.span(); ln.Line < int64(lo) || ln.Line > int64(hi) {
						t.Errorf("pc desc %+v: %s line %d outside [%d, %d]", d, ln.Function, ln.Line, lo, hi)
					}
					if ln.File != "JBurn.java" {
						t.Errorf("%s file %q", ln.Function, ln.File)
					}
				}
				for _, ln := range f.Lines[:len(f.Lines)-1] {
					inlined[ln.Function] = true
				}
				// The same PcDesc from a leaf pc just before it.
				if d.pc > 0 {
					g, err := n.Frame(pid, FrameCompiled, gamma.addr, word(gamma.nm.codeBegin+uint32(d.pc)-1), false)
					if err == nil && len(g.Lines) == 0 {
						t.Errorf("leaf frame without lines")
					}
				}
			}
			if named == 0 {
				t.Fatal("no pc desc of jGammaBurn had a scope")
			}
			if !inlined["JBurn$Mix.step"] || !inlined["JBurn$Mix.rotate"] {
				t.Errorf("inlined methods %v, want JBurn$Mix.step and rotate", inlined)
			}

			// Lines of the scopes are javap's at the scopes' bcis.
			checkScopeLines(t, vm, gamma, known)

			// A compile id the blob does not hold is stale.
			d := gamma.nm.pcs[len(gamma.nm.pcs)-1]
			bad := uint64(uint32(id+1000))<<32 | uint64(gamma.nm.codeBegin+uint32(max(d.pc, 0)))
			if _, err := n.Frame(pid, FrameCompiled, gamma.addr, bad, true); !errors.Is(err, ErrStale) {
				t.Errorf("wrong compile id: %v, want ErrStale", err)
			}

			// As the eBPF walker reports it (the PC, the compile id's low
			// 16 bits, the method): the same frame; with a compile id the
			// blob does not hold, the method the sample read names it alone.
			pc := gamma.addr + uint64(gamma.nm.codeBegin) + uint64(max(d.pc, 0))
			want, err := n.Frame(pid, FrameCompiled, gamma.addr, word(gamma.nm.codeBegin+uint32(max(d.pc, 0))), true)
			if err != nil {
				t.Fatal(err)
			}
			got, err := n.CompiledFrame(pid, pc, uint16(id), gamma.nm.method, true)
			if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("CompiledFrame = %+v, %v; want %+v", got, err, want)
			}
			got, err = n.CompiledFrame(pid, pc, uint16(id+1), gamma.nm.method, true)
			if err != nil || got.Tier != TierCompiled || len(got.Lines) != 1 || got.Lines[0].SystemName != "JBurn.jGammaBurn(I)J" {
				t.Errorf("CompiledFrame with a stale compile id = %+v, %v; want JBurn.jGammaBurn(I)J alone, tier %s", got, err, TierCompiled)
			}
			if _, err := n.CompiledFrame(pid, pc, uint16(id+1), 0, true); !errors.Is(err, ErrStale) {
				t.Errorf("CompiledFrame with a stale compile id and no method: %v, want ErrStale", err)
			}

			// Interpreter frames of jGammaBurn: bcp at each line's first bci.
			m, err := readMethod(mem, vm.l, gamma.nm.method)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range lines["jGammaBurn"].bciLine {
				f, err := n.Frame(pid, FrameInterpreted, gamma.nm.method, m.codeStart+uint64(e[0]), false)
				if err != nil {
					t.Fatalf("interpreted bci %d: %v", e[0], err)
				}
				want := fmt.Sprintf("JBurn.jGammaBurn JBurn.java:%d interpreted", e[1])
				if got := fmt.Sprintf("%s %s:%d %s", f.Lines[0].Function, f.Lines[0].File, f.Lines[0].Line, f.Tier); got != want {
					t.Errorf("interpreted bci %d: %s, want %s", e[0], got, want)
				}
			}
			// 0 is the bcp of a native method's interpreter frame, not of this one.
			for _, bcp := range []uint64{0, m.codeStart - 1, m.codeStart + m.codeSize, m.codeStart + 1<<20} {
				if _, err := n.Frame(pid, FrameInterpreted, gamma.nm.method, bcp, false); !errors.Is(err, ErrStale) {
					t.Errorf("bcp %#x outside [%#x, %#x): %v, want ErrStale", bcp, m.codeStart, m.codeStart+m.codeSize, err)
				}
			}

			// The interpreter's blob is a stub named Interpreter.
			found := false
			for _, b := range blobs {
				if b.nm == nil && !b.hdr.nmethod && b.addr <= vm.Kernel.InterpStart && vm.Kernel.InterpStart < b.addr+uint64(b.hdr.size) {
					f, err := n.Frame(pid, FrameCompiled, b.addr, uint64(vm.Kernel.InterpStart-b.addr), false)
					if err != nil {
						t.Fatalf("interpreter blob: %v", err)
					}
					if f.Tier != TierStub || f.Lines[0].Function != "Interpreter" {
						t.Errorf("interpreter blob named %+v", f)
					}
					found = true
				}
			}
			if !found {
				t.Errorf("no blob holds the interpreter at %#x", vm.Kernel.InterpStart)
			}
			s := n.Stats()
			t.Logf("%s: %d blobs, jGammaBurn compile %d with %d pc descs; stats %+v", vm.Release, len(blobs), id, len(gamma.nm.pcs), s)
			if s.Named == 0 || s.Stale < 4 || s.Bytes <= 0 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// checkScopeLines decodes each scope of b and checks its line against
// javap's table at its bci.
func checkScopeLines(t *testing.T, vm *VM, b liveBlob, known map[string]lineTable) {
	t.Helper()
	mem, err := python.OpenMem("/proc", pidOf(t, vm))
	if err != nil {
		t.Fatal(err)
	}
	defer testutil.Close(t, mem)
	checked := 0
	for _, d := range b.nm.pcs {
		for off := d.scope; off != 0; {
			sc, err := decodeScope(b.nm.scopes, off, vm.l.unsigned5)
			if err != nil {
				t.Fatalf("scope %d: %v", off, err)
			}
			m, err := readMethod(mem, vm.l, b.nm.metadata[sc.metadata-1])
			if err != nil {
				t.Fatal(err)
			}
			lt, ok := known[m.function]
			if ok && sc.bci >= 0 {
				if got, want := m.line(sc.bci).Line, int64(lt.lineAt(int(sc.bci))); got != want {
					t.Errorf("%s bci %d: line %d, javap says %d", m.function, sc.bci, got, want)
				}
				checked++
			}
			off = sc.sender
		}
	}
	if checked == 0 {
		t.Error("no scope checked")
	}
}

var testPIDs = map[*VM]int{}

func pidOf(t *testing.T, vm *VM) int {
	t.Helper()
	p, ok := testPIDs[vm]
	if !ok {
		t.Fatal("vm of no known pid")
	}
	return p
}

// TestNamerEveryNmethod names every nmethod of a live JVM of each JDK (the
// JDK's own classes, hidden classes and native wrappers included) at each
// PcDesc: none may be unreadable.
func TestNamerEveryNmethod(t *testing.T) {
	testutil.RequireRoot(t, "reading a JVM's memory")
	for _, j := range installedJDKs(t) {
		t.Run(j.name, func(t *testing.T) {
			dir := compile(t, j, "JBurn")
			cmd := startJava(t, j, dir, "JBurn", nil, "90")
			pid := cmd.Process.Pid
			vm, mem := findVM(t, pid)
			n := NewNamer("/proc", 4<<20)
			if err := n.Add(pid, vm); err != nil {
				t.Fatal(err)
			}
			defer n.Forget(pid)
			_, blobs := waitCompiled(t, vm, mem, "JBurn.jGammaBurn", TierC2)
			tiers := map[string]int{}
			lambdas := 0
			frames, stale := 0, 0
			type named struct{ addr, word uint64 }
			var again []named // frames to name again: cache hits
			for _, b := range blobs {
				if b.nm == nil {
					if b.hdr.nmethod {
						continue // freed or changed while walking
					}
					f, err := n.Frame(pid, FrameCompiled, b.addr, 0, false)
					if err != nil {
						t.Errorf("stub %s at %#x: %v", b.name, b.addr, err)
					} else if f.Tier != TierStub || f.Lines[0].Function != b.name || b.name == "" {
						t.Errorf("stub %q named %+v", b.name, f)
					}
					tiers[TierStub]++
					continue
				}
				word := uint64(uint32(b.hdr.compileID)) << 32
				pcs := []uint32{b.nm.codeBegin}
				for _, d := range b.nm.pcs {
					// Skip the first and last PcDescs: sentinels before and
					// after the code.
					if pc := b.nm.codeBegin + uint32(d.pc); d.pc >= 0 && pc < b.nm.size {
						pcs = append(pcs, pc)
					}
				}
				for _, pc := range pcs {
					f, err := n.Frame(pid, FrameCompiled, b.addr, word|uint64(pc), true)
					if errors.Is(err, ErrStale) {
						stale++
						continue // the JVM freed it since the walk
					}
					if err != nil {
						t.Fatalf("%s at %#x pc %#x: %v", b.method, b.addr, pc, err)
					}
					frames++
					tiers[f.Tier]++
					if len(again) < 200 {
						again = append(again, named{b.addr, word | uint64(pc)})
					}
					outer := f.Lines[len(f.Lines)-1]
					if outer.Function != b.method {
						t.Errorf("nmethod of %s named %s", b.method, outer.Function)
					}
					for _, l := range f.Lines {
						if !strings.Contains(l.Function, ".") || !strings.HasPrefix(l.SystemName, l.Function+"(") {
							t.Errorf("malformed name %+v", l)
						}
						if strings.HasPrefix(l.Function, "JBurn$$Lambda") {
							lambdas++
							if !hiddenName.MatchString(l.Function) {
								t.Errorf("hidden class name %q", l.Function)
							}
						}
					}
				}
			}
			s := n.Stats()
			t.Logf("%s: %d blobs, %d frames by tier %v; stats %+v", vm.Release, len(blobs), frames, tiers, s)
			if tiers[TierC1] == 0 || tiers[TierC2] == 0 || tiers[TierStub] == 0 {
				t.Errorf("tiers %v: want c1, c2 and stubs", tiers)
			}
			if lambdas == 0 {
				t.Error("JBurn's lambda is in no frame")
			}
			if stale > frames/10 {
				t.Errorf("%d stale frames of %d", stale, frames)
			}
			if s.Bytes > 4<<20 {
				t.Errorf("cache %d bytes over its bound", s.Bytes)
			}
			if s.Loads == 0 {
				t.Errorf("no load counted: %+v", s)
			}
			// Named again without an eviction since, a frame is a cache hit.
			for _, a := range again {
				_, _ = n.Frame(pid, FrameCompiled, a.addr, a.word, true)
			}
			if s2 := n.Stats(); s2.Evictions == s.Evictions && s2.Loads != s.Loads {
				t.Errorf("%d frames named again: %d loads, want none", len(again), s2.Loads-s.Loads)
			}
		})
	}
}

// hiddenName is how HotSpot names a lambda's method: JBurn$$Lambda$14/0x0000000800c0b000.run
// (JDK 17) or JBurn$$Lambda/0x00007f0a4c001234.run (JDK 21 and later).
var hiddenName = regexp.MustCompile(`^JBurn\$\$Lambda(\$\d+)?/0x[0-9a-f]+\.run$`)
