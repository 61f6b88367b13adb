package jvm

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// TestInterpreterFrameSlots checks the per-version interpreter frame slots
// on a live JVM of each JDK: a thread parked in interpreted code
// (jSleeper calling Thread.sleep, run with -Xint) must have, on its stack,
// jSleeper's Method* at InterpMethod from a frame pointer, a bcp inside
// its bytecodes at the call's line at InterpBCP, and its sender sp above
// the frame at InterpSenderSP.
func TestInterpreterFrameSlots(t *testing.T) {
	testutil.RequireRoot(t, "reading a JVM's memory")
	for _, j := range installedJDKs(t) {
		t.Run(j.name, func(t *testing.T) {
			dir := compile(t, j, "JSleep")
			lines := javapLines(t, j, dir, "JSleep")
			cmd := startJava(t, j, dir, "JSleep", []string{"-Xint"}, "60")
			pid := cmd.Process.Pid
			vm, mem := findVM(t, pid)
			n := NewNamer("/proc", 1<<20)
			if err := n.Add(pid, vm); err != nil {
				t.Fatal(err)
			}
			defer n.Forget(pid)
			k := vm.Kernel
			deadline := time.Now().Add(30 * time.Second)
			for {
				found := scanInterpreted(t, pid, mem, k, n)
				// jSleeper at its only line, jOuter at the call in its loop.
				if found["JSleep.jSleeper"] == int64(lines["jSleeper"].bciLine[0][1]) &&
					found["JSleep.jOuter"] == sourceLine(t, "JSleep", "jSleeper();") &&
					found["JSleep.main"] == sourceLine(t, "JSleep", "jOuter(args") {
					t.Logf("%s: interpreted frames %v", vm.Release, found)
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("interpreted frames found: %v; want jSleeper line %v, jOuter and main", found, lines["jSleeper"].bciLine)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// scanInterpreted looks through the stacks of pid's threads parked in a
// system call for interpreter frames laid out as k says, and names them.
func scanInterpreted(t *testing.T, pid int, mem Memory, k Kernel, n *Namer) map[string]int64 {
	t.Helper()
	found := map[string]int64{}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/syscall", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) != 9 {
			continue // running
		}
		sp, err := strconv.ParseUint(strings.TrimPrefix(f[7], "0x"), 16, 64)
		if err != nil {
			continue
		}
		const span = 256 << 10
		stack := make([]byte, span)
		got := 0
		for got < span {
			if err := mem.ReadAt(stack[got:got+4096], sp+uint64(got)); err != nil {
				break
			}
			got += 4096
		}
		stack = stack[:got]
		word := func(a uint64) (uint64, bool) {
			if a < sp || a+8 > sp+uint64(len(stack)) {
				return 0, false
			}
			return binary.LittleEndian.Uint64(stack[a-sp:]), true
		}
		// Every 8-byte slot is a candidate frame pointer.
		for fp := sp; fp+16 <= sp+uint64(len(stack)); fp += 8 {
			saved, _ := word(fp)
			senderSP, ok1 := word(uint64(int64(fp) + int64(k.InterpSenderSP)))
			method, ok2 := word(uint64(int64(fp) + int64(k.InterpMethod)))
			bcp, ok3 := word(uint64(int64(fp) + int64(k.InterpBCP)))
			if !ok1 || !ok2 || !ok3 || saved <= fp || senderSP <= fp || method == 0 || method%8 != 0 {
				continue
			}
			fr, err := n.Frame(pid, FrameInterpreted, method, bcp, true)
			if err != nil {
				continue
			}
			if _, seen := found[fr.Lines[0].Function]; !seen {
				found[fr.Lines[0].Function] = fr.Lines[0].Line
			}
		}
	}
	return found
}

// sourceLine is the line of testdata/class.java that holds text.
func sourceLine(t *testing.T, class, text string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", class+".java"))
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, text) {
			return int64(i + 1)
		}
	}
	t.Fatalf("%s.java holds no %q", class, text)
	return 0
}
