// g0work keeps the Go runtime busy on its system stacks: two goroutines
// hand values to each other, so the scheduler runs on g0 through
// runtime.mcall, and garbage keeps the collector working, partly through
// runtime.systemstack.
package main

import "runtime"

var sink []byte

func main() {
	ch := make(chan int)
	go func() {
		for v := range ch {
			sink = make([]byte, 64+v%512)
		}
	}()
	for i := 0; ; i++ {
		ch <- i
		if i%128 == 0 {
			runtime.Gosched()
		}
	}
}
