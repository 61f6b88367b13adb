// gosys keeps the collector busy on the system stack: a live heap of
// linked nodes to mark, and garbage allocated fast enough, with GOGC at 5,
// that a cycle always runs. The collector's mark workers drain their work
// through runtime.systemstack on their goroutines; main's allocations
// assist it, main.main -> main.churn -> runtime.mallocgc -> ... ->
// runtime.systemstack, and start cycles the same way.
package main

import "runtime/debug"

type node struct {
	next *node
	pad  [7]*node
}

var (
	live []*node
	sink *node
)

//go:noinline
func churn() {
	for i := 0; ; i++ {
		sink = &node{next: sink}
		if i%256 == 0 {
			sink = nil
		}
	}
}

func main() {
	debug.SetGCPercent(5)
	live = make([]*node, 1<<15)
	for i := range live {
		live[i] = &node{}
		if i > 0 {
			live[i].next = live[i-1]
		}
	}
	churn()
}
