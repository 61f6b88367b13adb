package pprofexporter

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/google/pprof/profile"
)

// frameNames returns the names of a sample's frames, leaf first, one per
// line of each location (inline frames innermost first). A location without
// lines is named after its mapping's file, "[libc.so.6]", or "[unknown]".
func frameNames(s *profile.Sample, dst []string) []string {
	for _, l := range s.Location {
		if len(l.Line) == 0 {
			name := "[unknown]"
			if l.Mapping != nil && l.Mapping.File != "" {
				name = "[" + filepath.Base(l.Mapping.File) + "]"
			}
			dst = append(dst, name)
			continue
		}
		for _, ln := range l.Line {
			dst = append(dst, ln.Function.Name)
		}
	}
	return dst
}

// foldedName makes a frame name safe for a folded line: ';' separates frames
// and a line ends the record.
var foldedReplacer = strings.NewReplacer(";", ":", "\n", " ", "\r", " ")

// writeFolded writes p's stacks as folded text, one line "root;...;leaf
// count" per distinct stack, sorted, with the values of the first sample
// type. The root is the process's executable name when the sample has one.
func writeFolded(w io.Writer, p *profile.Profile) error {
	counts := map[string]int64{}
	var names []string
	var b strings.Builder
	for _, s := range p.Sample {
		if len(s.Value) == 0 || s.Value[0] == 0 {
			continue
		}
		names = frameNames(s, names[:0])
		b.Reset()
		if exe := s.Label[attrExeName]; len(exe) > 0 && exe[0] != "" {
			b.WriteString(foldedReplacer.Replace(exe[0]))
			if len(names) > 0 {
				b.WriteByte(';')
			}
		}
		for i := len(names) - 1; i >= 0; i-- {
			b.WriteString(foldedReplacer.Replace(names[i]))
			if i > 0 {
				b.WriteByte(';')
			}
		}
		if b.Len() == 0 {
			b.WriteString("[unknown]")
		}
		counts[b.String()] += s.Value[0]
	}
	bw := bufio.NewWriter(w)
	for _, stack := range slices.Sorted(maps.Keys(counts)) {
		bw.WriteString(stack)
		bw.WriteByte(' ')
		bw.WriteString(strconv.FormatInt(counts[stack], 10))
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// topEntry is one function's share of a sample type.
type topEntry struct {
	name      string
	flat, cum int64
}

// topTable is the per-function totals of one sample type.
type topTable struct {
	typ     profile.ValueType
	total   int64
	entries []topEntry
}

// topFunctions sums, per sample type across groups, each function's flat
// value (it is the leaf) and cumulative value (it is anywhere on the stack,
// counted once per sample).
func topFunctions(groups []group) []topTable {
	type acc struct {
		total int64
		byFn  map[string]*topEntry
	}
	var order []profile.ValueType
	accs := map[profile.ValueType]*acc{}
	var names []string
	seen := map[string]bool{}
	for _, g := range groups {
		for ti, st := range g.prof.SampleType {
			vt := profile.ValueType{Type: st.Type, Unit: st.Unit}
			a := accs[vt]
			if a == nil {
				a = &acc{byFn: map[string]*topEntry{}}
				accs[vt] = a
				order = append(order, vt)
			}
			for _, s := range g.prof.Sample {
				v := s.Value[ti]
				if v == 0 {
					continue
				}
				a.total += v
				names = frameNames(s, names[:0])
				clear(seen)
				for i, n := range names {
					e := a.byFn[n]
					if e == nil {
						e = &topEntry{name: n}
						a.byFn[n] = e
					}
					if i == 0 {
						e.flat += v
					}
					if !seen[n] {
						seen[n] = true
						e.cum += v
					}
				}
			}
		}
	}
	tables := make([]topTable, 0, len(order))
	for _, vt := range order {
		a := accs[vt]
		t := topTable{typ: vt, total: a.total}
		for _, e := range a.byFn {
			t.entries = append(t.entries, *e)
		}
		tables = append(tables, t)
	}
	return tables
}

// formatTop renders the top n functions of each table by flat and by
// cumulative value, like `go tool pprof -top`.
func formatTop(tables []topTable, n int) string {
	var b strings.Builder
	for i, t := range tables {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "top %d functions of %d %s (%s)", n, t.total, t.typ.Type, t.typ.Unit)
		for _, by := range []struct {
			name string
			key  func(topEntry) int64
		}{
			{"flat", func(e topEntry) int64 { return e.flat }},
			{"cum", func(e topEntry) int64 { return e.cum }},
		} {
			slices.SortFunc(t.entries, func(a, b topEntry) int {
				return cmp.Or(cmp.Compare(by.key(b), by.key(a)), cmp.Compare(a.name, b.name))
			})
			fmt.Fprintf(&b, "\n  by %s:\n  %12s %6s %12s %6s  %s", by.name, "flat", "flat%", "cum", "cum%", "function")
			for _, e := range t.entries[:min(n, len(t.entries))] {
				if by.key(e) == 0 {
					break
				}
				fmt.Fprintf(&b, "\n  %12d %5.1f%% %12d %5.1f%%  %s", e.flat, percent(e.flat, t.total), e.cum, percent(e.cum, t.total), e.name)
			}
		}
	}
	return b.String()
}

func percent(v, total int64) float64 {
	if total == 0 {
		return 0
	}
	return 100 * float64(v) / float64(total)
}
