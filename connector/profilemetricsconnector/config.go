package profilemetricsconnector

import (
	"errors"
	"fmt"
	"time"
)

// Defaults of the configuration: safe for a node agent. Series of a
// resource and frame type number about executables × frame types; 2,000
// holds a busy node's programs, and idle series expire.
const (
	DefaultMaxSeries    = 2000
	DefaultTopFunctions = 20
	DefaultMaxFunctions = 1000
	DefaultExpireAfter  = 10 * time.Minute

	maxMaxSeries = 1_000_000
)

// DefaultResourceAttributes key the series. process.pid is left out: PIDs
// churn and would fill max_series with one-off series.
var DefaultResourceAttributes = []string{"process.executable.name", "service.name", "container.id"}

// Config is the configuration of the profile metrics connector.
type Config struct {
	// ResourceAttributes are the resource attributes that label every
	// series; a resource without one gets no such label.
	ResourceAttributes []string `mapstructure:"resource_attributes"`
	// MaxSeries bounds the series of each metric keyed by resource and frame
	// type. Samples of new keys beyond it are counted in one series labelled
	// otel.metric.overflow="true".
	MaxSeries int `mapstructure:"max_series"`
	// TopFunctions is how many functions, by cumulative leaf samples, are
	// exported each interval. 0 turns the function metric off.
	TopFunctions int `mapstructure:"top_functions"`
	// MaxFunctions bounds the functions counted (executable, function,
	// frame type); beyond it new ones go to the overflow series.
	MaxFunctions int `mapstructure:"max_functions"`
	// ExpireAfter removes series that had no sample for this long, so exited
	// programs free their place. 0 keeps them.
	ExpireAfter time.Duration `mapstructure:"expire_after"`

	// prevent unkeyed literal initialization
	_ struct{}
}

func createDefaultConfig() *Config {
	return &Config{
		ResourceAttributes: append([]string(nil), DefaultResourceAttributes...),
		MaxSeries:          DefaultMaxSeries,
		TopFunctions:       DefaultTopFunctions,
		MaxFunctions:       DefaultMaxFunctions,
		ExpireAfter:        DefaultExpireAfter,
	}
}

// Validate checks every field and reports every problem, each naming its key.
func (c *Config) Validate() error {
	var errs []error
	seen := map[string]bool{}
	for i, a := range c.ResourceAttributes {
		switch {
		case a == "":
			errs = append(errs, fmt.Errorf("resource_attributes[%d]: must not be empty", i))
		case a == attrFrameType || a == attrFunction || a == attrOverflow:
			errs = append(errs, fmt.Errorf("resource_attributes[%d]: %q is a label of the connector's own", i, a))
		case seen[a]:
			errs = append(errs, fmt.Errorf("resource_attributes[%d]: %q is listed twice", i, a))
		}
		seen[a] = true
	}
	if c.MaxSeries < 1 || c.MaxSeries > maxMaxSeries {
		errs = append(errs, fmt.Errorf("max_series: must be between 1 and %d, got %d", maxMaxSeries, c.MaxSeries))
	}
	if c.MaxFunctions < 1 || c.MaxFunctions > maxMaxSeries {
		errs = append(errs, fmt.Errorf("max_functions: must be between 1 and %d, got %d", maxMaxSeries, c.MaxFunctions))
	}
	if c.TopFunctions < 0 || c.TopFunctions > c.MaxFunctions {
		errs = append(errs, fmt.Errorf("top_functions: must be between 0 and max_functions (%d), got %d", c.MaxFunctions, c.TopFunctions))
	}
	if c.ExpireAfter < 0 {
		errs = append(errs, fmt.Errorf("expire_after: must not be negative, got %v", c.ExpireAfter))
	}
	return errors.Join(errs...)
}
