package pprofexporter

import (
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
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
	// DefaultFileMode keeps profiles to the Collector's user: they can carry
	// command lines and environment values.
	DefaultFileMode FileMode = 0o600

	// maxMaxFiles bounds max_files so one directory listing stays cheap.
	maxMaxFiles = 1_000_000
	// maxLogTop bounds log_top so the summary stays a readable block.
	maxLogTop = 1000
	// maxLogStacks bounds log_stacks for the same reason.
	maxLogStacks = 1000
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
	// LogStacks logs, after each export, its LogStacks heaviest stacks per
	// sample type, leaf first: the resource (service, executable, PID,
	// container), the sample's attributes (thread, CPU) and each frame's
	// type, function, file and line. 0 turns it off.
	LogStacks int `mapstructure:"log_stacks"`
	// FileMode is the permission of the files written, before the process's
	// umask takes its bits away, as the kernel does for any new file.
	FileMode FileMode `mapstructure:"file_mode"`

	// prevent unkeyed literal initialization
	_ struct{}
}

func createDefaultConfig() *Config {
	return &Config{
		Directory: DefaultDirectory,
		SplitBy:   DefaultSplitBy,
		MaxFiles:  DefaultMaxFiles,
		FileMode:  DefaultFileMode,
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
	if c.LogStacks < 0 || c.LogStacks > maxLogStacks {
		errs = append(errs, fmt.Errorf("log_stacks: must be between 0 and %d, got %d", maxLogStacks, c.LogStacks))
	}
	if c.FileMode&^0o777 != 0 {
		errs = append(errs, fmt.Errorf("file_mode: must be permission bits within 0777, got %#o (write it in octal, e.g. \"0640\")", uint32(c.FileMode)))
	}
	if c.FileMode&0o600 != 0o600 {
		errs = append(errs, fmt.Errorf("file_mode: the owner must be able to read and write, got %#o", uint32(c.FileMode)))
	}
	return errors.Join(errs...)
}

// FileMode is a file's permission bits. In YAML it is an octal string
// ("0640", "0o640") or a number, which YAML reads as octal when it starts
// with 0 (0640).
type FileMode uint32

// UnmarshalText reads an octal mode.
func (m *FileMode) UnmarshalText(text []byte) error {
	s := strings.TrimPrefix(strings.TrimPrefix(string(text), "0o"), "0O")
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil {
		return fmt.Errorf("file mode %q: want octal permission bits such as \"0600\"", text)
	}
	*m = FileMode(v)
	return nil
}

// String prints the mode in octal, as chmod takes it.
func (m FileMode) String() string { return fmt.Sprintf("%#o", uint32(m)) }

// dirMode is the mode of a directory whose files have mode m: each class
// that may read the files may also search the directory.
func (m FileMode) dirMode() fs.FileMode {
	d := fs.FileMode(m)
	return d | (d&0o444)>>2
}
