package tracer

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// ring is the reader of one BPF ring buffer. Its reader is used from one
// goroutine at a time; flush and close are safe to call concurrently with a
// read. The ring owns both descriptors and closes them in close.
type ring struct {
	reader *ringbuf.Reader
	// ready is a non-blocking duplicate of the ring buffer's descriptor,
	// registered with the Go runtime's network poller: a reader parks on it
	// instead of blocking a thread in epoll_wait, which would keep the
	// runtime's sysmon polling every 20 µs while it lasts.
	ready     *os.File
	readyConn syscall.RawConn
	// kicked: Kick asked the reader to read now; a wait that begins
	// after the kick returns at once.
	kicked atomic.Bool
	// stopping: flush was called. Until then an empty ring buffer is never
	// handed to the reader (see hasData).
	stopping atomic.Bool
	// mu guards raw, which every record read from the ring passes through
	// before it is decoded into its Record: one buffer for the biggest
	// record (a sample with a stack snapshot, 20 KiB), not one in each of
	// the hundreds of Records a reader keeps in flight.
	mu     sync.Mutex
	raw    ringbuf.Record
	closed bool // close began: the reader's mapping may be gone; guarded by mu
}

// hasData reports whether the reader should be asked for a record: the ring
// buffer holds one, or flush was called (the reader then says ErrFlushed
// once it is empty). Asked with nothing to read, the
// reader calls epoll_wait before it can say so, and every system call that
// finds the runtime's sysmon thread asleep wakes it into 20 µs polling for
// as long as the process runs: on the node-like host those calls drove most
// of sysmon's wake-ups. Called with mu held, before close.
func (r *ring) hasData() bool {
	return r.reader.AvailableBytes() > 0 || r.stopping.Load()
}

// newRing opens a reader of m. On error nothing is left open.
func newRing(m *ebpf.Map) (*ring, error) {
	rd, err := ringbuf.NewReader(m)
	if err != nil {
		return nil, err
	}
	r := &ring{reader: rd}
	if r.ready, r.readyConn, err = pollable(m.FD()); err != nil {
		_ = rd.Close()
		return nil, err
	}
	return r, nil
}

// wait parks until the kernel wakes the ring buffer's readers, poll passes,
// flush sets the deadline to now, or close closes the file. The runtime's
// poller is edge-triggered: a wake-up that came while records were being
// read ends the next wait at once.
func (r *ring) wait(poll time.Duration) {
	if err := r.ready.SetReadDeadline(time.Now().Add(poll)); err != nil {
		return // closed: the reader says so next
	}
	// A kick that came before the deadline above was set must not be
	// lost under it; one that comes after it moves the deadline.
	if r.kicked.Swap(false) {
		return
	}
	defer r.kicked.Store(false)
	waited := false
	_ = r.readyConn.Read(func(uintptr) bool {
		if waited {
			return true
		}
		waited = true
		return false // park until readable or the deadline
	})
}

// kick makes a parked reader read what the ring buffer holds now.
func (r *ring) kick() {
	r.kicked.Store(true)
	_ = r.ready.SetReadDeadline(time.Now())
}

// flush makes the reader return what is left, then ringbuf.ErrFlushed.
func (r *ring) flush() error {
	if r == nil {
		return nil
	}
	r.stopping.Store(true)
	err := r.reader.Flush()
	// Wake a reader parked in the poller: it reads what is left.
	_ = r.ready.SetReadDeadline(time.Now())
	return err
}

// close closes the poller's file first, which wakes a parked reader, then
// the reader.
func (r *ring) close() error {
	if r == nil {
		return nil
	}
	err := r.ready.Close()
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	return errors.Join(err, r.reader.Close())
}

// pollable returns a non-blocking duplicate of fd registered with the Go
// runtime's poller, and its RawConn. The caller owns the file.
func pollable(fd int) (*os.File, syscall.RawConn, error) {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("dup: %w", err)
	}
	if err := unix.SetNonblock(dup, true); err != nil {
		_ = unix.Close(dup)
		return nil, nil, fmt.Errorf("set non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(dup), "sonde ring buffer")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	return f, rc, nil
}
