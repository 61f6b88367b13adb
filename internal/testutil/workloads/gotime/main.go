// gotime reads the clock in a loop: main.main -> main.tick -> time.Now,
// whose runtime.walltime and runtime.nanotime1 call the vDSO's
// clock_gettime on the thread's system stack. A sample in the vDSO
// reaches main.main only by crossing back to the goroutine's stack.
package main

import "time"

var sink int64

//go:noinline
func tick() {
	for range 1000 {
		sink += time.Now().UnixNano()
	}
}

func main() {
	for {
		tick()
	}
}
