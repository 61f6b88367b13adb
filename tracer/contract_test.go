package tracer

import (
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/support"
)

// Every counter of the C enum has an entry named after it, and every field
// of Counters is fed by exactly one counter.
func TestEveryCounterNamed(t *testing.T) {
	spec, err := support.LoadSonde()
	if err != nil {
		t.Fatal(err)
	}
	var enum *btf.Enum
	if err := spec.Types.TypeByName("counter", &enum); err != nil {
		t.Fatal(err)
	}
	seen := map[*uint64]string{}
	var c Counters
	for _, v := range enum.Values {
		if v.Name == "COUNTER_MAX" {
			if v.Value != uint64(len(counters)) {
				t.Errorf("COUNTER_MAX = %d, the Go table has %d entries", v.Value, len(counters))
			}
			continue
		}
		if v.Value >= uint64(len(counters)) {
			t.Errorf("%s = %d is past the Go table", v.Name, v.Value)
			continue
		}
		ctr := counters[v.Value]
		want := strings.ToLower(strings.TrimPrefix(v.Name, "COUNTER_"))
		if ctr.name != want || ctr.field == nil {
			t.Errorf("%s: Go entry %q (field set: %v), want %q with a field", v.Name, ctr.name, ctr.field != nil, want)
			continue
		}
		p := ctr.field(&c)
		if other, dup := seen[p]; dup {
			t.Errorf("%s and %s feed the same field", other, v.Name)
		}
		seen[p] = v.Name
	}
	if n := reflect.TypeFor[Counters]().NumField(); len(seen) != n {
		t.Errorf("%d counters feed Counters' %d fields", len(seen), n)
	}
}

// The limits Go takes from the generated constants are the object's.
func TestTableLimitsMatchSpec(t *testing.T) {
	spec, err := support.LoadSonde()
	if err != nil {
		t.Fatal(err)
	}
	tables := spec.Maps[support.SondeMapTables]
	if tables.MaxEntries != MaxTables {
		t.Errorf("tables map holds %d tables, MaxTables = %d", tables.MaxEntries, MaxTables)
	}
	if tables.InnerMap == nil || tables.InnerMap.ValueSize != uint32(RowSize) {
		t.Errorf("tables' inner map %+v, want rows of %d bytes", tables.InnerMap, RowSize)
	}
	if RowKernelBytes%8 != 0 || RowKernelBytes < int64(RowSize) || RowKernelBytes >= int64(RowSize)+8 {
		t.Errorf("RowKernelBytes = %d for rows of %d bytes, want the next multiple of 8", RowKernelBytes, RowSize)
	}
	// loadTable's arrays carry these flags; the kernel takes an inner map
	// only if its flags are the template's. (TestLoadTable checks the
	// memory such an array takes against TableKernelBytes.)
	if want := uint32(unix.BPF_F_INNER_MAP | unix.BPF_F_MMAPABLE); tables.InnerMap != nil && tables.InnerMap.Flags != want {
		t.Errorf("tables' inner map flags %#x, want %#x (inner, mmapable)", tables.InnerMap.Flags, want)
	}
	// A set of the row cache is its two ways, one 64-byte cache line: a
	// mappable array's values start on a page, a plain one's after its
	// header, where every other set would straddle two lines.
	rows := spec.Maps[support.SondeMapRowCache]
	if rows.Flags != unix.BPF_F_MMAPABLE || rows.ValueSize != 32 {
		t.Errorf("row cache: flags %#x, entries of %d bytes; want %#x (mmapable) and 32 (two a cache line)",
			rows.Flags, rows.ValueSize, unix.BPF_F_MMAPABLE)
	}
}
