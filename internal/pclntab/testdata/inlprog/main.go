// Command inlprog is the fixture of the pclntab tests. It captures its own
// stacks with runtime.Callers at chosen points, some inside inlined calls,
// and prints, for every physical frame, its return PC and the logical
// frames runtime.CallersFrames gives for it, innermost first:
//
//	pc <hex call PC: the return address minus one>
//	frame <function>\t<file>\t<line>
//	end
package main

import (
	"fmt"
	"os"
	"runtime"
)

var sink int

// capture records the stack of its caller.
//
//go:noinline
func capture() {
	pcs := make([]uintptr, 64)
	n := runtime.Callers(2, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	// A physical frame is the run of logical frames up to one with a Func:
	// CallersFrames leaves Func nil for inlined calls. Its first PC is the
	// real return address; the others are synthesized call sites.
	var group []runtime.Frame
	for {
		f, more := frames.Next()
		group = append(group, f)
		if f.Func != nil {
			fmt.Printf("pc %x\n", group[0].PC)
			for _, g := range group {
				fmt.Printf("frame %s\t%s\t%d\n", g.Function, g.File, g.Line)
			}
			fmt.Println("end")
			group = group[:0]
		}
		if !more {
			break
		}
	}
}

// leafInline is inlined into its callers and captures from inside.
func leafInline(n int) int {
	capture()
	return n + 1
}

// midInline is inlined too: capturing through it gives two inline levels.
func midInline(n int) int {
	return leafInline(n*2) + 3
}

//go:noinline
func outer(n int) int {
	s := midInline(n)
	s += leafInline(n)
	return s
}

//go:noinline
func direct(n int) int {
	capture()
	return n - 1
}

type T struct{ v int }

// method is inlined into its caller.
func (t *T) method() int {
	capture()
	return t.v
}

//go:noinline
func viaMethod(n int) int {
	t := &T{v: n}
	return t.method()
}

func main() {
	sink += outer(len(os.Args))
	sink += direct(len(os.Args))
	sink += viaMethod(len(os.Args))
	func() {
		capture()
	}()
}
