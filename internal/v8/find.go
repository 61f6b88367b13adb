package v8

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/process"
)

// nodeOfV8 is the Node major that ships each V8 major (for what the
// binary does not say itself).
var nodeOfV8 = map[int]int{10: 18, 11: 20, 12: 22, 13: 24, 14: 26}

// Find locates V8 in p and reads its layout. A process that maps no file
// exporting v8dbg_* symbols matches ErrNotV8; a V8 whose metadata lacks a
// needed constant matches ErrUnknownVersion. mem is p's memory; the
// metadata is read from the file, which holds it as constants.
func Find(p *process.Process, mem Memory) (*VM, error) {
	_ = mem
	var firstErr error
	seen := map[string]bool{}
	for _, m := range p.Mappings {
		if !m.FileBacked() || seen[m.Path] || !strings.Contains(m.Perms, "x") {
			continue
		}
		seen[m.Path] = true
		path := p.FilePath(m)
		if path == "" {
			continue
		}
		img, err := loadImage(path)
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("v8 file %s: %w", m.Path, err)
			}
			continue
		}
		if img == nil {
			continue
		}
		vm, err := img.vm(p, m)
		if err != nil {
			return nil, fmt.Errorf("v8 file %s: %w", m.Path, err)
		}
		vm.File = path
		return vm, nil
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return nil, ErrNotV8
}

// image is what Find learns of one binary exporting V8's metadata.
type image struct {
	md                 metadata
	major, minor       int
	version, node      string
	l                  *layout
	k                  Kernel
	err                error  // the layout's, if unsupported
	blobStart, blobEnd uint64 // the embedded builtins, file virtual addresses
	blobOffset         uint64 // their file offset
	builtins           *builtinTable
	// bytecodeSizes is Ignition's Bytecodes::kBytecodeSizes: the size of
	// each bytecode with its operands, at operand scale 1, 2 and 4.
	bytecodeSizes []byte
}

// imageKey identifies a file's contents well enough to reuse what was
// read of it.
type imageKey struct {
	dev, ino   uint64
	size, mtim int64
}

const maxImages = 8

var (
	imagesMu sync.Mutex
	images   = map[imageKey]*image{}
	// notV8 remembers files without V8 metadata (bounded like images).
	notV8 = map[imageKey]bool{}
)

// loadImage reads path's metadata, or returns nil, nil when it has none.
func loadImage(path string) (*image, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	key := imageKey{size: st.Size(), mtim: st.ModTime().UnixNano()}
	if sys, ok := statIDs(st); ok {
		key.dev, key.ino = sys[0], sys[1]
	} else {
		return readImage(path)
	}
	imagesMu.Lock()
	img, ok := images[key]
	no := notV8[key]
	imagesMu.Unlock()
	if ok {
		return img, nil
	}
	if no {
		return nil, nil
	}
	img, err = readImage(path)
	if err != nil {
		return nil, err
	}
	imagesMu.Lock()
	defer imagesMu.Unlock()
	if img == nil {
		if len(notV8) >= 256 {
			clear(notV8)
		}
		notV8[key] = true
		return nil, nil
	}
	if len(images) >= maxImages {
		clear(images)
	}
	images[key] = img
	return img, nil
}

// nodeVersionRes find Node's version in its .rodata: in its release URL
// (official builds), else alone between NULs (process.version).
var nodeVersionRes = []*regexp.Regexp{
	regexp.MustCompile(`release/(v[1-9][0-9]?\.[0-9]{1,3}\.[0-9]{1,3})/`),
	regexp.MustCompile(`\x00(v[1-9][0-9]?\.[0-9]{1,3}\.[0-9]{1,3})\x00`),
}

// readImage reads the metadata of the ELF file at path. Node's binary is
// about 100 MB, its symbol tables 17 MB and its .rodata 47 MB: they are read
// in place from a read-only mapping of the file (page cache), never copied
// into the heap, and only the few values kept are.
func readImage(path string) (*image, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, err
	}
	f, err := elf.NewFile(fh)
	if err != nil {
		return nil, err
	}
	mapped, err := elfx.MapImage(fh, st.Size())
	if err != nil {
		return nil, err
	}
	defer mapped.Unmap()
	data := mapped.Bytes()
	md := metadata{}
	eachSymbol(f, data, elf.SHT_DYNSYM, func(name []byte, s elf.Symbol) {
		rest, ok := bytes.CutPrefix(name, []byte("v8dbg_"))
		if !ok || (s.Size != 4 && s.Size != 8) {
			return
		}
		if v, err := readInt(f, s.Value, s.Size); err == nil {
			md[string(rest)] = v
		}
	})
	if len(md) == 0 {
		return nil, nil
	}
	img := &image{md: md}
	var ver [4]int64
	verNames := map[string]int{"_ZN2v88internal7Version6major_E": 0, "_ZN2v88internal7Version6minor_E": 1,
		"_ZN2v88internal7Version6build_E": 2, "_ZN2v88internal7Version6patch_E": 3}
	found := 0
	var bt []builtin
	eachSymbol(f, data, elf.SHT_SYMTAB, func(name []byte, s elf.Symbol) {
		if string(name) == "_ZN2v88internal11interpreter9Bytecodes14kBytecodeSizesE" && s.Size%3 == 0 && s.Size <= 3*1024 {
			if b, err := readBytes(f, s.Value, s.Size); err == nil {
				img.bytecodeSizes = b
			}
			return
		}
		if i, ok := verNames[string(name)]; ok {
			if v, err := readInt(f, s.Value, 4); err == nil {
				ver[i] = v
				found |= 1 << i
			}
			return
		}
		if rest, ok := bytes.CutPrefix(name, []byte("Builtins_")); ok && elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Size > 0 {
			bt = append(bt, builtin{start: s.Value, size: s.Size, name: string(rest)})
		}
	})
	if found&3 != 3 {
		return nil, fmt.Errorf("v8 metadata without V8's version (v8::internal::Version): %w", ErrUnknownVersion)
	}
	img.major, img.minor = int(ver[0]), int(ver[1])
	img.version = fmt.Sprintf("%d.%d.%d.%d", ver[0], ver[1], ver[2], ver[3])
	if len(bt) == 0 {
		return nil, fmt.Errorf("v8 %s: no Builtins_* symbols: %w", img.version, ErrUnknownVersion)
	}
	sort.Slice(bt, func(i, j int) bool { return bt[i].start < bt[j].start })
	img.builtins = &builtinTable{fns: bt}
	img.blobStart = bt[0].start
	for _, b := range bt {
		img.blobEnd = max(img.blobEnd, b.start+b.size)
	}
	off, ok := fileOffset(f, img.blobStart)
	if !ok {
		return nil, fmt.Errorf("v8 %s: builtins at %#x in no segment: %w", img.version, img.blobStart, ErrUnknownVersion)
	}
	img.blobOffset = off
	img.builtins.fileOffset = off
	if s := f.Section(".rodata"); s != nil && s.Type != elf.SHT_NOBITS && s.Offset+s.Size <= uint64(len(data)) {
		img.node = nodeVersion(data[s.Offset:s.Offset+s.Size], nodeOfV8[img.major])
	}
	img.l, img.err = newLayout(md, img.major)
	if img.err == nil {
		img.k, img.err = img.l.kernel(md)
	}
	return img, nil
}

// readInt reads a size-byte little-endian integer at the file's virtual
// address va (0 past a segment's file bytes: .bss).
func readInt(f *elf.File, va, size uint64) (int64, error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || va < p.Vaddr || va+size > p.Vaddr+p.Memsz {
			continue
		}
		if va+size > p.Vaddr+p.Filesz {
			return 0, nil
		}
		b := make([]byte, size)
		if _, err := p.ReadAt(b, int64(va-p.Vaddr)); err != nil {
			return 0, err
		}
		if size == 4 {
			return int64(int32(binary.LittleEndian.Uint32(b))), nil
		}
		return int64(binary.LittleEndian.Uint64(b)), nil
	}
	return 0, fmt.Errorf("address %#x in no segment", va)
}

// readBytes reads size bytes at the file's virtual address va.
func readBytes(f *elf.File, va, size uint64) ([]byte, error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || va < p.Vaddr || va+size > p.Vaddr+p.Filesz {
			continue
		}
		b := make([]byte, size)
		if _, err := p.ReadAt(b, int64(va-p.Vaddr)); err != nil {
			return nil, err
		}
		return b, nil
	}
	return nil, fmt.Errorf("address %#x in no segment", va)
}

// fileOffset is the file offset of virtual address va.
func fileOffset(f *elf.File, va uint64) (uint64, bool) {
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && va >= p.Vaddr && va < p.Vaddr+p.Filesz {
			return p.Off + va - p.Vaddr, true
		}
	}
	return 0, false
}

// vm is the VM of a process that maps img (m one of its executable
// mappings).
func (img *image) vm(p *process.Process, m process.Mapping) (*VM, error) {
	vm := &VM{V8: img.version, V8Major: img.major, V8Minor: img.minor, Node: img.node,
		NodeMajor: nodeOfV8[img.major], Untested: !testedV8[img.major], l: img.l, builtins: img.builtins,
		bytecodeSizes: img.bytecodeSizes}
	if img.node != "" {
		vm.NodeMajor, _ = strconv.Atoi(strings.SplitN(img.node[1:], ".", 2)[0])
	}
	if img.err != nil {
		return vm, fmt.Errorf("v8 %s (node %s): %w", img.version, img.node, img.err)
	}
	vm.Kernel = img.k
	// The builtins run where the file is mapped, and where V8 maps them
	// again near its code space (Node 22+: the embedded blob remapped
	// into the code range for short calls): every executable mapping of
	// the file covering the blob's file offsets.
	size := img.blobEnd - img.blobStart
	for _, mm := range p.Mappings {
		if mm.Path != m.Path || mm.Inode != m.Inode || !strings.Contains(mm.Perms, "x") {
			continue
		}
		lo, hi := max(mm.Offset, img.blobOffset), min(mm.Offset+(mm.End-mm.Start), img.blobOffset+size)
		if lo >= hi {
			continue
		}
		r := Range{Start: mm.Start + (lo - mm.Offset), End: mm.Start + (hi - mm.Offset)}
		if len(vm.Kernel.Builtins) < MaxBuiltinRanges {
			vm.Kernel.Builtins = append(vm.Kernel.Builtins, r)
			vm.builtinOffs = append(vm.builtinOffs, lo-img.blobOffset)
		}
	}
	if len(vm.Kernel.Builtins) == 0 {
		return vm, fmt.Errorf("v8 %s: builtins not mapped: %w", img.version, ErrUnknownVersion)
	}
	return vm, nil
}

// builtin is one embedded builtin: its file virtual address and size.
type builtin struct {
	start, size uint64
	name        string
}

// builtinTable names builtins by their offset in the binary.
type builtinTable struct {
	fns        []builtin
	fileOffset uint64 // of fns[0]
}

// at names the builtin at offset off from the blob's start.
func (t *builtinTable) at(off uint64) (string, bool) {
	if t == nil || len(t.fns) == 0 {
		return "", false
	}
	va := t.fns[0].start + off
	i := sort.Search(len(t.fns), func(i int) bool { return t.fns[i].start > va }) - 1
	if i < 0 || va >= t.fns[i].start+t.fns[i].size {
		return "", false
	}
	return t.fns[i].name, true
}

// nodeVersion finds the version ("v20.20.2") of Node major want in data.
func nodeVersion(data []byte, want int) string {
	for _, re := range nodeVersionRes {
		for _, m := range re.FindAllSubmatch(data, 64) {
			if maj, _ := strconv.Atoi(strings.SplitN(string(m[1][1:]), ".", 2)[0]); maj == want {
				return string(m[1])
			}
		}
	}
	return ""
}

// eachSymbol calls fn with the name (in place: copy what is kept) and value
// of each symbol of f's first section of type typ, read from data, the
// whole file.
func eachSymbol(f *elf.File, data []byte, typ elf.SectionType, fn func(name []byte, s elf.Symbol)) {
	const entSize = 24 // Elf64_Sym
	if f.Class != elf.ELFCLASS64 {
		return
	}
	var syms, strs *elf.Section
	for _, sec := range f.Sections {
		if sec.Type == typ {
			syms = sec
			break
		}
	}
	if syms == nil || int(syms.Link) >= len(f.Sections) {
		return
	}
	strs = f.Sections[syms.Link]
	if syms.Offset+syms.Size > uint64(len(data)) || strs.Offset+strs.Size > uint64(len(data)) {
		return
	}
	tab := data[syms.Offset : syms.Offset+syms.Size]
	str := data[strs.Offset : strs.Offset+strs.Size]
	bo := f.ByteOrder
	for off := entSize; off+entSize <= len(tab); off += entSize { // entry 0 is the null symbol
		e := tab[off : off+entSize]
		nameOff := bo.Uint32(e[0:4])
		if uint64(nameOff) >= uint64(len(str)) {
			continue
		}
		name := str[nameOff:]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		fn(name, elf.Symbol{Info: e[4], Other: e[5], Section: elf.SectionIndex(bo.Uint16(e[6:8])),
			Value: bo.Uint64(e[8:16]), Size: bo.Uint64(e[16:24])})
	}
}
