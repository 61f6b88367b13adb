package process

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// procmapQuery is struct procmap_query of linux/fs.h (Linux 6.11): one
// question to an open /proc/PID/maps about the mapping at or after an
// address, and the kernel's answer.
type procmapQuery struct {
	size        uint64
	queryFlags  uint64
	queryAddr   uint64
	vmaStart    uint64
	vmaEnd      uint64
	vmaFlags    uint64
	vmaPageSize uint64
	vmaOffset   uint64
	inode       uint64
	devMajor    uint32
	devMinor    uint32
	vmaNameSize uint32
	buildIDSize uint32
	vmaNameAddr uint64
	buildIDAddr uint64
}

const (
	// procmapQueryIoctl is PROCMAP_QUERY: _IOWR('f', 17, struct
	// procmap_query).
	procmapQueryIoctl = 3<<30 | uint(unsafe.Sizeof(procmapQuery{}))<<16 | 'f'<<8 | 17

	// Flags of procmap_query, as asked (query_flags) and as told
	// (vma_flags).
	pmqReadable       = 0x01
	pmqWritable       = 0x02
	pmqExecutable     = 0x04
	pmqShared         = 0x08
	pmqCoveringOrNext = 0x10
)

// queryExecMappings lists the executable mappings of the process whose
// maps file f is, in address order, by asking the kernel one mapping at a
// time (PROCMAP_QUERY). The kernel skips the other mappings and formats
// nothing: reading the whole text of a process's maps to find its few
// executable ones costs several times more. The result equals the text's
// executable lines, but for the vsyscall page, which is no mapping of the
// process's own.
//
// ok is false, with nothing read, where the kernel has no such ioctl
// (before 6.11): the caller then reads the text.
func queryExecMappings(f *os.File) (ms []Mapping, ok bool, err error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, false, err
	}
	var name [unix.PathMax]byte
	var qerr error
	cerr := rc.Control(func(fd uintptr) {
		var lastRaw, lastPath string // consecutive mappings of a file share one
		for addr, n := uint64(0), 0; ; n++ {
			if n >= maxMapsLines {
				qerr = fmt.Errorf("maps: more than %d executable mappings", maxMapsLines)
				return
			}
			q := procmapQuery{
				size:        uint64(unsafe.Sizeof(procmapQuery{})),
				queryFlags:  pmqExecutable | pmqCoveringOrNext,
				queryAddr:   addr,
				vmaNameSize: uint32(len(name)),
				vmaNameAddr: uint64(uintptr(unsafe.Pointer(&name[0]))),
			}
			_, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uintptr(procmapQueryIoctl), uintptr(unsafe.Pointer(&q)))
			switch {
			case errno == unix.ENOENT: // none at or after addr
				ok = true
				return
			case n == 0 && (errno == unix.ENOTTY || errno == unix.EINVAL):
				return // no PROCMAP_QUERY here
			case errno == unix.ESRCH:
				// The memory map is gone (a leader that exited): as an
				// empty text would say.
				ok, qerr = true, fmt.Errorf("%w: no memory map", errChanged)
				return
			case errno != 0:
				ok, qerr = true, fmt.Errorf("query maps at %#x: %w", addr, errno)
				return
			case q.vmaEnd <= q.vmaStart || q.vmaEnd <= addr || q.vmaNameSize > uint32(len(name)):
				ok, qerr = true, fmt.Errorf("query maps at %#x: %w: mapping %#x-%#x", addr, errMapsSyntax, q.vmaStart, q.vmaEnd)
				return
			}
			m := Mapping{
				Start:  q.vmaStart,
				End:    q.vmaEnd,
				Offset: q.vmaOffset,
				Perms:  queryPerms(q.vmaFlags),
				Dev:    unix.Mkdev(q.devMajor, q.devMinor),
				Inode:  q.inode,
			}
			var path []byte
			if q.vmaNameSize > 0 {
				path = name[:q.vmaNameSize-1] // the size counts the NUL
			}
			path, m.Deleted = bytes.CutSuffix(path, []byte(deletedSuffix))
			if string(path) != lastRaw {
				// As the text prints it: a newline in a file name is
				// escaped.
				lastRaw = string(path)
				lastPath = strings.ReplaceAll(lastRaw, "\n", `\012`)
			}
			m.Path = lastPath
			ms = append(ms, m)
			addr = q.vmaEnd
		}
	})
	if cerr != nil {
		return nil, false, cerr
	}
	return ms, ok, qerr
}

// queryPerms is the permission string of the text for PROCMAP_QUERY's
// vma_flags.
func queryPerms(flags uint64) string {
	p := []byte("---p")
	if flags&pmqReadable != 0 {
		p[0] = 'r'
	}
	if flags&pmqWritable != 0 {
		p[1] = 'w'
	}
	if flags&pmqExecutable != 0 {
		p[2] = 'x'
	}
	if flags&pmqShared != 0 {
		p[3] = 's'
	}
	return permString(p)
}
