package process

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// Task flags from /proc/PID/stat field 9 (include/linux/sched.h).
const (
	pfExiting = 0x00000004 // getting shut down
	pfKthread = 0x00200000 // a kernel thread
)

// maxStatLen bounds a read of /proc/PID/stat: 52 numeric fields of at most
// 20 digits plus a command name of at most 64 bytes fit well below it.
const maxStatLen = 4096

// procStat is what the table needs from /proc/PID/stat.
type procStat struct {
	PID       int
	Comm      string
	State     byte   // field 3: R, S, D, Z, X, ...
	PPID      int    // field 4
	Flags     uint64 // field 9
	StartTime uint64 // field 22, clock ticks since boot
}

func (s procStat) kernelThread() bool { return s.Flags&pfKthread != 0 }

// dead reports whether the task has exited (a zombie waiting to be reaped,
// or being torn down).
func (s procStat) dead() bool { return s.State == 'Z' || s.State == 'X' || s.State == 'x' }

var errStatSyntax = errors.New("malformed stat")

// parseStat parses the single line of /proc/PID/stat. The command name
// (field 2) is enclosed in parentheses and may itself contain spaces,
// parentheses and newlines, so it runs from the first '(' to the last ')'.
func parseStat(b []byte) (procStat, error) {
	var s procStat
	open := bytes.IndexByte(b, '(')
	closing := bytes.LastIndexByte(b, ')')
	if open < 1 || closing < open {
		return s, fmt.Errorf("%w: no command name", errStatSyntax)
	}
	pid, err := strconv.Atoi(string(bytes.TrimRight(b[:open], " ")))
	if err != nil || pid < 0 {
		return s, fmt.Errorf("%w: pid %q", errStatSyntax, b[:open])
	}
	s.PID = pid
	s.Comm = string(b[open+1 : closing])

	// Fields 3.. follow, separated by single spaces.
	rest := b[closing+1:]
	const last = 22
	for field := 3; field <= last; field++ {
		rest = bytes.TrimLeft(rest, " ")
		end := bytes.IndexAny(rest, " \n")
		if end < 0 {
			end = len(rest)
		}
		tok := rest[:end]
		rest = rest[end:]
		if len(tok) == 0 {
			return s, fmt.Errorf("%w: %d fields, want at least %d", errStatSyntax, field-1, last)
		}
		switch field {
		case 3:
			if len(tok) != 1 {
				return s, fmt.Errorf("%w: state %q", errStatSyntax, tok)
			}
			s.State = tok[0]
		case 4:
			ppid, err := strconv.Atoi(string(tok))
			if err != nil || ppid < 0 {
				return s, fmt.Errorf("%w: ppid %q", errStatSyntax, tok)
			}
			s.PPID = ppid
		case 9:
			if s.Flags, err = strconv.ParseUint(string(tok), 10, 64); err != nil {
				return s, fmt.Errorf("%w: flags %q", errStatSyntax, tok)
			}
		case 22:
			if s.StartTime, err = strconv.ParseUint(string(tok), 10, 64); err != nil {
				return s, fmt.Errorf("%w: start time %q", errStatSyntax, tok)
			}
		}
	}
	return s, nil
}
