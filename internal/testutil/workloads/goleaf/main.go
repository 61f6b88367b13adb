// goleaf burns CPU in a frameless leaf: main.main -> main.alpha ->
// main.beta -> main.leaf. leaf keeps everything in registers and calls
// nothing, so the compiler gives it no frame and no frame-pointer save: a
// frame-pointer walk from inside it skips beta.
package main

var sink int

//go:noinline
func leaf(n int) int {
	s := 0
	for i := 0; i < n; i++ {
		s += i*i ^ s
	}
	return s
}

//go:noinline
func beta(n int) int {
	t := 0
	for range 10 {
		t += leaf(n)
	}
	return t
}

//go:noinline
func alpha(n int) int { return beta(n) + 1 }

func main() {
	for {
		sink += alpha(1_000_000)
	}
}
