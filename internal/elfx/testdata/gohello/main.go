// Command gohello is a Go fixture for the elfx tests: a binary with a
// .note.go.buildid note and a non-zero load address.
package main

import "fmt"

//go:noinline
func work(n int) int {
	s := 0
	for i := range n {
		s += i * i
	}
	return s
}

func main() { fmt.Println(work(1000)) }
