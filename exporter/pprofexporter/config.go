package pprofexporter

import (
	"errors"
	"fmt"
	"time"
)

// SplitBy says how the ResourceProfiles of one export are grouped into files.
type SplitBy string

const (
	// SplitNone writes every export as one file.
	SplitNone SplitBy = "none"
	// SplitService writes one file per service.name per export; resources
	// without one go to "unknown_service".
	SplitService SplitBy = "service"
	// SplitExecutable writes one file per process.executable.name per export;
	// resources without one go to "unknown".
	SplitExecutable SplitBy = "executable"
)

// Defaults of the configuration.
const (
	DefaultDirectory = "./profiles"
	DefaultSplitBy   = SplitNone
	DefaultMaxFiles  = 100

	// maxMaxFiles bounds max_files so one directory listing stays cheap.
	maxMaxFiles = 1_000_000
	// maxLogTop bounds log_top so the summary stays a readable block.
	maxLogTop = 1000
)

// Config is the configuration of the pprof exporter.
type Config struct {
	// Directory receives the files; it is created at start if missing.
	Directory string `mapstructure:"directory"`
	// SplitBy groups the resources of an export into files: none, service or
	// executable.
	SplitBy SplitBy `mapstructure:"split_by"`
	// MaxFiles is how many profiles (a .pb.gz and its .folded twin count as
	// one) are kept; older ones are removed after each export. 0 keeps all.
	MaxFiles int `mapstructure:"max_files"`
	// MaxAge removes profiles older than this after each export. 0 keeps all.
	MaxAge time.Duration `mapstructure:"max_age"`
	// Folded also writes each file's stacks as folded text
	// ("root;...;leaf count" per line) next to the pprof file.
	Folded bool `mapstructure:"folded"`
	// LogTop logs, after each export, the top LogTop functions by flat and by
	// cumulative samples. 0 turns the summary off.
	LogTop int `mapstructure:"log_top"`

	// prevent unkeyed literal initialization
	_ struct{}
}

func createDefaultConfig() *Config {
	return &Config{
		Directory: DefaultDirectory,
		SplitBy:   DefaultSplitBy,
		MaxFiles:  DefaultMaxFiles,
	}
}

// Validate checks every field and reports every problem, each naming its key.
// It has no side effects: the directory is created at start.
func (c *Config) Validate() error {
	var errs []error
	if c.Directory == "" {
		errs = append(errs, errors.New("directory: must not be empty"))
	}
	switch c.SplitBy {
	case SplitNone, SplitService, SplitExecutable:
	default:
		errs = append(errs, fmt.Errorf("split_by: must be none, service or executable, got %q", c.SplitBy))
	}
	if c.MaxFiles < 0 || c.MaxFiles > maxMaxFiles {
		errs = append(errs, fmt.Errorf("max_files: must be between 0 and %d, got %d", maxMaxFiles, c.MaxFiles))
	}
	if c.MaxAge < 0 {
		errs = append(errs, fmt.Errorf("max_age: must not be negative, got %v", c.MaxAge))
	}
	if c.LogTop < 0 || c.LogTop > maxLogTop {
		errs = append(errs, fmt.Errorf("log_top: must be between 0 and %d, got %d", maxLogTop, c.LogTop))
	}
	return errors.Join(errs...)
}
