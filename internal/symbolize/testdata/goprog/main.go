// Command goprog is the Go fixture of the symbolize tests: main calls a, a
// calls b, b calls c, none inlined.
package main

import (
	"fmt"
	"os"
)

//go:noinline
func c(n int) int {
	s := 0
	for i := range n {
		s += i ^ (s >> 3)
	}
	return s
}

//go:noinline
func b(n int) int {
	s := c(n)
	s += c(n / 2)
	return s
}

//go:noinline
func a(n int) int {
	s := 0
	for i := range 3 {
		s += b(n + i)
	}
	return s
}

func main() {
	fmt.Println(a(1000 + len(os.Args)))
}
