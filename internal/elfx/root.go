package elfx

import "errors"

// ErrNotSupported is returned when the kernel or platform lacks a feature
// this package needs (openat2(2), Linux 5.6). Match it with errors.Is.
var ErrNotSupported = errors.New("not supported")
