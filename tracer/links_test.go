package tracer

import "github.com/cilium/ebpf/link"

func countLinks() int {
	n := 0
	it := new(link.Iterator)
	defer it.Close()
	for it.Next() {
		n++
		it.Take().Close()
	}
	return n
}
