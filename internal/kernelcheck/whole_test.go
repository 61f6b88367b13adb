package kernelcheck

import (
	"strings"
	"testing"
)

// The guest's criterion of a whole stack, on stacks of each shape.
func TestGuestWorkloadWhole(t *testing.T) {
	sig := guestWorkloads["signal"]
	c := guestWorkloads["cchain-nofp"]
	cgo := guestWorkloads["gocall"]
	callback := guestWorkloads["gocgo"]
	// A stack of the callback, leaf first, as the x86-64 test has it.
	cb := "c_leaf _cgo_0b1c_Cfunc_c_leaf runtime.asmcgocall runtime.cgocall main._Cfunc_c_leaf main.goInner main.goCallback " +
		"_cgoexp_0b1c_goCallback runtime.cgocallbackg1 runtime.cgocallbackg runtime.cgocallbackg runtime.cgocallback " +
		"crosscall2 goCallback c_middle c_outer _cgo_0b1c_Cfunc_c_outer runtime.asmcgocall runtime.cgocall main._Cfunc_c_outer " +
		"main.goOuter main.main runtime.main runtime.goexit"
	for _, tc := range []struct {
		w     guestWorkload
		stack string
		want  bool
	}{
		{c, "c b a main __libc_start_call_main __libc_start_main_impl _start", true},
		{c, "c b a main _start", true},
		{c, "c b main _start", false},          // a frame skipped
		{c, "c b a main", false},               // not down to the root
		{c, "c b a main  _start", false},       // an unnamed frame
		{c, "c b a main _start [vdso]", false}, // the root not outermost
		{sig, "handler [vdso] b a main __libc_start_call_main _start", true},
		{sig, "handler __kernel_rt_sigreturn a main _start", true},
		{sig, "handler [vdso] main __libc_start_call_main _start", true},
		{sig, "handler b a main _start", false},                        // no signal frame
		{sig, "handler [vdso] a _start", false},                        // main skipped
		{sig, "handler [vdso] b main _start", false},                   // a skipped
		{sig, "handler __kernel_clock_gettime b a main _start", false}, // not the trampoline
		{sig, "handler [vdso] b a main", false},                        // not down to the root
		{sig, "handler [vdso] __libc_start_call_main _start", false},   // the interrupted code lost
		{sig, "handler [vdso] b a main  _start", false},                // an unnamed frame
		{sig, "handler [vdso] b a main __libc_start_main_impl _start", true},
		{cgo, "c_leaf c_outer _cgo_0b1c_Cfunc_c_outer runtime.asmcgocall runtime.cgocall main._Cfunc_c_outer main.goOuter main.main runtime.main runtime.goexit", true},
		{cgo, "c_leaf c_outer _cgo_0b1c_Cfunc_c_outer runtime.asmcgocall", false},                                            // ends at the switch
		{cgo, "c_leaf c_outer runtime.asmcgocall runtime.cgocall main.main runtime.main runtime.goexit", false},              // goOuter skipped
		{cgo, "c_leaf c_outer main.goOuter runtime.asmcgocall runtime.cgocall main.main runtime.main runtime.goexit", false}, // out of order
		{guestWorkloads["gotime"], "__kernel_clock_gettime runtime.nanotime1 runtime.nanotime time.now time.Now main.tick main.main runtime.main runtime.goexit", true},
		{guestWorkloads["gotime"], "__kernel_clock_gettime runtime.nanotime time.now time.Now main.tick main.main runtime.main runtime.goexit", false}, // nanotime1 skipped
		{guestWorkloads["gotime"], "__kernel_clock_gettime runtime.nanotime1 runtime.nanotime runtime.sysmon runtime.mstart1 runtime.mstart0 runtime.mstart", false},
		{callback, cb, true},
		{callback, strings.Replace(cb, "crosscall2 goCallback c_middle c_outer _cgo_0b1c_Cfunc_c_outer runtime.asmcgocall", "runtime.systemstack_switch", 1), false}, // Go's own traceback: no C frames
		{callback, strings.Replace(cb, "c_middle ", "", 1), false}, // a C frame skipped
		{callback, cb[:strings.Index(cb, " crosscall2")], false},   // ends at the switch back
	} {
		st := strings.Split(tc.stack, " ")
		if got := tc.w.whole(st); got != tc.want {
			t.Errorf("%q: whole %v, want %v", tc.stack, got, tc.want)
		}
	}
}

// The criterion of a workload checked through a frame, and of the signal
// frame's direct finding of the interrupted leaf.
func TestGuestWorkloadThrough(t *testing.T) {
	g := guestWorkloads["gosys"]
	for _, tc := range []struct {
		stack         string
		counts, whole bool
	}{
		{"runtime.gcDrain runtime.gcBgMarkWorker.func2 runtime.systemstack runtime.gcBgMarkWorker runtime.goexit", true, true},
		{"runtime.scanobject runtime.gcDrainN runtime.systemstack runtime.mallocgc main.churn main.main runtime.main runtime.goexit", true, true},
		{"runtime.gcDrain runtime.gcBgMarkWorker.func2 runtime.systemstack", true, false}, // ends at the switch
		{"runtime.gcDrain  runtime.systemstack runtime.gcBgMarkWorker runtime.goexit", true, false},
		{"runtime.schedule runtime.park_m runtime.mcall", false, false},
		{"main.churn main.main runtime.main runtime.goexit", false, true},
	} {
		st := strings.Split(tc.stack, " ")
		if got := g.counts(st); got != tc.counts {
			t.Errorf("%q: counts %v, want %v", tc.stack, got, tc.counts)
		}
		if got := g.counts(st) && g.whole(st); got != (tc.counts && tc.whole) {
			t.Errorf("%q: whole %v, want %v", tc.stack, got, tc.counts && tc.whole)
		}
	}
	gt := guestWorkloads["gotime"]
	if gt.counts(strings.Split("__kernel_clock_gettime runtime.nanotime1 runtime.nanotime runtime.sysmon runtime.mstart1 runtime.mstart0 runtime.mstart", " ")) ||
		!gt.counts(strings.Split("__kernel_clock_gettime runtime.walltime time.now main.tick", " ")) {
		t.Error("gotime: only the stacks through main.tick count")
	}
	sig := guestWorkloads["signal"]
	if !sig.direct(strings.Split("handler [vdso] b a main _start", " ")) ||
		sig.direct(strings.Split("handler [vdso] a main _start", " ")) {
		t.Error("direct: b right below the signal frame is direct, a is not")
	}
}
