// gochain burns CPU in a known call chain: main.main -> main.alpha ->
// main.beta -> main.gamma. gamma keeps a local array so it has a stack frame
// (and a frame pointer); frameless leaves are the unwinder's problem, not
// this fixture's.
package main

var sink uint64

//go:noinline
func gamma(seed uint64) uint64 {
	var buf [64]uint64
	for i := range 20_000_000 {
		j := (seed + uint64(i)) % uint64(len(buf))
		buf[j] += uint64(i) ^ buf[(j+7)%uint64(len(buf))]
	}
	return buf[seed%uint64(len(buf))]
}

//go:noinline
func beta(seed uint64) uint64 { return gamma(seed) + 1 }

//go:noinline
func alpha(seed uint64) uint64 { return beta(seed) + 1 }

func main() {
	for i := uint64(0); ; i++ {
		sink += alpha(i)
	}
}
