package pprofexporter

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/sonde-dev/sonde/internal/profileview"
)

// resourceKeys are the resource attributes that identify a process in the
// readable stacks, in the order printed; others (command line, environment)
// are left out to keep a stack's header one line.
var resourceKeys = []string{
	"service.name", "process.executable.name", "process.pid", "container.id",
	"k8s.namespace.name", "k8s.pod.name", "k8s.container.name",
}

// heavyStack is one printed stack: the samples of one resource, stack and
// set of sample attributes, summed.
type heavyStack struct {
	resource string
	attrs    string
	frames   []profileview.Frame
	value    int64
}

// stackTable is the heavy stacks of one sample type.
type stackTable struct {
	typ, unit string
	total     int64
	stacks    []*heavyStack
}

// heaviestStacks sums pd's samples by resource, stack and sample attributes,
// per sample type, and returns each type's stacks heaviest first.
func heaviestStacks(pd pprofile.Profiles) []stackTable {
	type key struct {
		typ, unit string
		res       int
		stack     int32
		attrs     string
	}
	var tables []stackTable
	tableOf := map[[2]string]int{}
	byKey := map[key]*heavyStack{}
	resText := map[int]string{}
	r := profileview.NewReader(pd)
	var b strings.Builder
	for s := range r.Samples() {
		if s.Value == 0 {
			continue
		}
		b.Reset()
		for i, a := range s.Attrs {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(a.Key + "=" + a.Value)
		}
		k := key{typ: s.Type, unit: s.Unit, res: s.ResourceIndex, stack: s.Stack, attrs: b.String()}
		ti, ok := tableOf[[2]string{s.Type, s.Unit}]
		if !ok {
			ti = len(tables)
			tableOf[[2]string{s.Type, s.Unit}] = ti
			tables = append(tables, stackTable{typ: s.Type, unit: s.Unit})
		}
		tables[ti].total += s.Value
		h := byKey[k]
		if h == nil {
			rt, ok := resText[s.ResourceIndex]
			if !ok {
				var parts []string
				for _, rk := range resourceKeys {
					if v, ok := s.Resource.Get(rk); ok && v.AsString() != "" {
						parts = append(parts, rk+"="+v.AsString())
					}
				}
				rt = strings.Join(parts, " ")
				resText[s.ResourceIndex] = rt
			}
			h = &heavyStack{resource: rt, attrs: k.attrs, frames: s.Frames}
			byKey[k] = h
			tables[ti].stacks = append(tables[ti].stacks, h)
		}
		h.value += s.Value
	}
	for _, t := range tables {
		// Heaviest first; ties in a stable, readable order.
		slices.SortStableFunc(t.stacks, func(a, b *heavyStack) int {
			return cmp.Or(cmp.Compare(b.value, a.value), strings.Compare(a.resource, b.resource), strings.Compare(a.attrs, b.attrs))
		})
	}
	return tables
}

// formatStacks renders the n heaviest stacks of each table, leaf first, one
// frame a line: its type, function and file:line, or its mapping and
// address when it has no function.
func formatStacks(tables []stackTable, n int) string {
	var b strings.Builder
	for i, t := range tables {
		if i > 0 {
			b.WriteByte('\n')
		}
		shown := t.stacks[:min(n, len(t.stacks))]
		fmt.Fprintf(&b, "heaviest %d of %d stacks, %d %s (%s) in all", len(shown), len(t.stacks), t.total, t.typ, t.unit)
		for j, h := range shown {
			fmt.Fprintf(&b, "\n#%d %d %s (%.1f%%)", j+1, h.value, t.typ, percent(h.value, t.total))
			if h.resource != "" {
				b.WriteString("\n  resource: " + h.resource)
			}
			if h.attrs != "" {
				b.WriteString("\n  sample:   " + h.attrs)
			}
			if len(h.frames) == 0 {
				b.WriteString("\n    (no frames)")
			}
			for _, f := range h.frames {
				fmt.Fprintf(&b, "\n    %-8s %s", cmp.Or(f.Type, "?"), f.Name())
				switch {
				case f.File != "" && f.Line > 0:
					fmt.Fprintf(&b, "  %s:%d", f.File, f.Line)
				case f.File != "":
					b.WriteString("  " + f.File)
				case f.Function != "" && f.Mapping != "":
					fmt.Fprintf(&b, "  %#x in %s", f.Address, f.Mapping)
				default:
					fmt.Fprintf(&b, "  %#x", f.Address)
				}
			}
		}
	}
	return b.String()
}
