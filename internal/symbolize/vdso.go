package symbolize

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/sonde-dev/sonde/internal/elfx"
)

// VDSOPath is how /proc/PID/maps names the vDSO's mapping.
const VDSOPath = "[vdso]"

// maxVDSOBytes bounds the vDSO image read: it is a few pages.
const maxVDSOBytes = 1 << 20

// VDSO names the functions of the vDSO, the small shared object the kernel
// maps into every process (clock_gettime, gettimeofday, getcpu, ...). It
// has no file to open: its image is read from this process's own memory,
// and since the kernel maps the same image into every 64-bit process of the
// host, it names theirs too. A process whose vDSO mapping differs in size
// (a 32-bit one) is not named by it.
type VDSO struct {
	f    *elf.File
	tab  *nativeTable
	size uint64
}

// ReadVDSO reads the vDSO of this process through procfs (normally
// /proc): its "[vdso]" mapping in self/maps, its bytes from self/mem.
func ReadVDSO(procfs string) (*VDSO, error) {
	start, end, err := vdsoRange(procfs + "/self/maps")
	if err != nil {
		return nil, err
	}
	mem, err := os.Open(procfs + "/self/mem")
	if err != nil {
		return nil, fmt.Errorf("read vdso: %w", err)
	}
	defer mem.Close()
	img := make([]byte, end-start)
	if _, err := mem.ReadAt(img, int64(start)); err != nil {
		return nil, fmt.Errorf("read vdso at %#x: %w", start, err)
	}
	return ParseVDSO(img)
}

// ParseVDSO indexes the function symbols of a vDSO image (its .dynsym).
func ParseVDSO(img []byte) (*VDSO, error) {
	f, err := elf.NewFile(bytes.NewReader(img))
	if err != nil {
		return nil, fmt.Errorf("vdso: %w", err)
	}
	tab, err := symbolSection(f, nil, elf.SHT_DYNSYM)
	if err != nil {
		return nil, fmt.Errorf("vdso: %w", err)
	}
	if tab == nil {
		return nil, errors.New("vdso: no function symbols")
	}
	return &VDSO{f: f, tab: tab, size: uint64(len(img))}, nil
}

// Size is the length of the vDSO mapping this VDSO names.
func (v *VDSO) Size() uint64 { return v.size }

// Lookup names the function at offset bytes into the vDSO's mapping;
// false when no function symbol covers it.
func (v *VDSO) Lookup(offset uint64) (string, bool) {
	addr, ok := elfx.OffsetToVaddr(v.f, offset)
	if !ok {
		return "", false
	}
	name, ok := v.tab.lookup(addr)
	if !ok || name == "" {
		return "", false
	}
	return strings.Clone(name), true
}

// vdsoRange returns the address range of the "[vdso]" line of a maps file.
func vdsoRange(maps string) (start, end uint64, err error) {
	f, err := os.Open(maps)
	if err != nil {
		return 0, 0, fmt.Errorf("find vdso: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasSuffix(line, " "+VDSOPath) {
			continue
		}
		lo, hi, ok := strings.Cut(strings.Fields(line)[0], "-")
		if !ok {
			break
		}
		if start, err = strconv.ParseUint(lo, 16, 64); err != nil {
			break
		}
		if end, err = strconv.ParseUint(hi, 16, 64); err != nil || end <= start || end-start > maxVDSOBytes {
			break
		}
		return start, end, nil
	}
	if err := sc.Err(); err != nil {
		return 0, 0, fmt.Errorf("find vdso: %w", err)
	}
	return 0, 0, fmt.Errorf("find vdso: no well-formed %s line in %s", VDSOPath, maps)
}
