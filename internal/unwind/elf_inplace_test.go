package unwind

import (
	"bytes"
	"debug/elf"
	"os"
	"slices"
	"testing"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// CFI sections read in place from a file's mapping give the table a copy
// of them gives, for a C library and for a cgo binary (Go and C rows).
func TestSectionsReadInPlace(t *testing.T) {
	for _, path := range []string{libcPath, testutil.BuildWorkload(t, testutil.GoCgo)} {
		file, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		st, err := file.Stat()
		if err != nil {
			t.Fatal(err)
		}
		img, err := elfx.MapImage(file, st.Size())
		file.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(img.Unmap)
		mapped, err := elf.NewFile(bytes.NewReader(img.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		inPlace, err := fromFile(mapped, img.Bytes(), nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		copied, err := fromFile(mapped, nil, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(inPlace.Rows) < 1000 || !slices.Equal(inPlace.Rows, copied.Rows) {
			t.Errorf("%s: %d rows read in place, %d from a copy: not the same table", path, len(inPlace.Rows), len(copied.Rows))
		}
		inPlace.release()
		copied.release()
	}
}
