//go:build !linux

package elfx

import (
	"fmt"
	"os"
)

// OpenInRoot needs openat2(2); outside Linux it always fails with
// ErrNotSupported.
func OpenInRoot(root, path string) (*os.File, error) {
	return nil, fmt.Errorf("open %s in %s: %w outside Linux", path, root, ErrNotSupported)
}
