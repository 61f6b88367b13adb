package sqliteexporter

import (
	"errors"
	"fmt"
	"time"
)

// Defaults of the configuration: a day of a node's profiles, at most 1 GiB.
const (
	DefaultPath       = "./profiles.db"
	DefaultMaxAge     = 24 * time.Hour
	DefaultMaxSizeMiB = 1024

	// maxMaxSizeMiB bounds max_size_mib at 1 TiB.
	maxMaxSizeMiB = 1 << 20
)

// Config is the configuration of the SQLite exporter.
type Config struct {
	// Path is the database file; it is created (mode 0600) at start if
	// missing, with its -wal and -shm files beside it.
	Path string `mapstructure:"path"`
	// MaxAge deletes intervals that ended longer ago than this, after each
	// export. 0 keeps all.
	MaxAge time.Duration `mapstructure:"max_age"`
	// MaxSizeMiB deletes the oldest intervals, after each export, while the
	// database's pages in use exceed this many MiB. 0 sets no bound.
	MaxSizeMiB int64 `mapstructure:"max_size_mib"`

	// prevent unkeyed literal initialization
	_ struct{}
}

func createDefaultConfig() *Config {
	return &Config{Path: DefaultPath, MaxAge: DefaultMaxAge, MaxSizeMiB: DefaultMaxSizeMiB}
}

// Validate checks every field and reports every problem, each naming its key.
// It has no side effects: the database is opened at start.
func (c *Config) Validate() error {
	var errs []error
	if c.Path == "" {
		errs = append(errs, errors.New("path: must not be empty"))
	}
	if c.MaxAge < 0 {
		errs = append(errs, fmt.Errorf("max_age: must not be negative, got %v", c.MaxAge))
	}
	if c.MaxSizeMiB < 0 || c.MaxSizeMiB > maxMaxSizeMiB {
		errs = append(errs, fmt.Errorf("max_size_mib: must be between 0 and %d, got %d", maxMaxSizeMiB, c.MaxSizeMiB))
	}
	return errors.Join(errs...)
}
