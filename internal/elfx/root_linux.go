package elfx

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// OpenInRoot opens path read-only as seen inside the root directory root
// (for example "/proc/1234/root" for process 1234). path is resolved with
// openat2(2) and RESOLVE_IN_ROOT, so absolute symlinks and ".." cannot leave
// root, and with RESOLVE_NO_MAGICLINKS, so /proc magic links inside the root
// cannot point outside it. The caller owns the returned file and closes it.
// Without openat2 the error wraps ErrNotSupported.
func OpenInRoot(root, path string) (*os.File, error) {
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open root", Path: root, Err: err}
	}
	defer func() { _ = unix.Close(rootFD) }() // an O_PATH descriptor: nothing to flush

	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOCTTY,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	for {
		fd, err := unix.Openat2(rootFD, path, &how)
		switch {
		case err == nil:
			return os.NewFile(uintptr(fd), filepath.Join(root, path)), nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOSYS):
			return nil, fmt.Errorf("open %s in %s: openat2 (Linux 5.6+) %w by this kernel", path, root, ErrNotSupported)
		default:
			return nil, &os.PathError{Op: "openat2 in " + root, Path: path, Err: err}
		}
	}
}
