package profilemetricsconnector

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/profileview"
)

// Labels of the connector's own.
const (
	attrFrameType = "profile.frame.type"
	attrFunction  = "code.function.name"
	attrExeName   = "process.executable.name"
	// attrOverflow marks the series that counts samples of keys beyond a
	// bound, as OpenTelemetry SDKs name their cardinality overflow.
	attrOverflow = "otel.metric.overflow"

	scopeName = "github.com/sonde-dev/sonde/connector/profilemetricsconnector"

	// unknownType labels frames without profile.frame.type and empty stacks.
	unknownType = "unknown"
)

// Metric names. The prometheus exporter adds units and _total:
// sonde_profile_samples_total, sonde_profile_cpu_time_seconds_total, ...
const (
	metricSamples    = "sonde.profile.samples"
	metricCPUTime    = "sonde.profile.cpu.time"
	metricFrameTypes = "sonde.profile.frame_type.samples"
	metricOffCPU     = "sonde.profile.off_cpu.time"
	metricFunctions  = "sonde.profile.function.samples"
)

// series is one cumulative counter: its label values, its integer and
// floating sums, when it started and when a sample last moved it.
type series struct {
	labels      []string // values of the table's label keys, in order
	n           int64
	f           float64
	start, last time.Time
}

// table is the series of one metric, bounded by max; samples of keys beyond
// it go to the overflow series.
type table struct {
	keys     []string // label keys
	max      int
	byKey    map[string]*series
	overflow *series
	warned   bool
}

func newTable(keys []string, bound int) *table {
	return &table{keys: keys, max: bound, byKey: map[string]*series{}}
}

// get returns the series of labels, creating it, or the overflow series when
// the table is full; overflowed is true then.
func (t *table) get(labels []string, now time.Time) (s *series, overflowed bool) {
	key := strings.Join(labels, "\x00")
	if s := t.byKey[key]; s != nil {
		s.last = now
		return s, false
	}
	if len(t.byKey) >= t.max {
		if t.overflow == nil {
			t.overflow = &series{start: now}
		}
		t.overflow.last = now
		return t.overflow, true
	}
	s = &series{labels: slices.Clone(labels), start: now, last: now}
	t.byKey[key] = s
	return s, false
}

// expire removes series no sample moved since before cutoff.
func (t *table) expire(cutoff time.Time) {
	for k, s := range t.byKey {
		if s.last.Before(cutoff) {
			delete(t.byKey, k)
		}
	}
	if t.overflow != nil && t.overflow.last.Before(cutoff) {
		t.overflow = nil
	}
}

// profileMetrics counts the profiles it consumes into cumulative series and
// hands all of them to next after each export.
type profileMetrics struct {
	cfg    *Config
	logger *zap.Logger
	next   consumer.Metrics
	now    func() time.Time

	mu         sync.Mutex
	samples    *table // resource attributes + leaf frame type: n samples, f CPU seconds
	frameTypes *table // resource attributes + frame type anywhere on the stack
	offCPU     *table // resource attributes: f off-CPU seconds
	functions  *table // executable, function, frame type: n leaf samples
	labels     []string
	seenTypes  map[string]bool
}

func newConnector(cfg *Config, logger *zap.Logger, next consumer.Metrics, now func() time.Time) *profileMetrics {
	withType := append(slices.Clone(cfg.ResourceAttributes), attrFrameType)
	return &profileMetrics{
		cfg: cfg, logger: logger, next: next, now: now,
		samples:    newTable(withType, cfg.MaxSeries),
		frameTypes: newTable(withType, cfg.MaxSeries),
		offCPU:     newTable(slices.Clone(cfg.ResourceAttributes), cfg.MaxSeries),
		functions:  newTable([]string{attrExeName, attrFunction, attrFrameType}, cfg.MaxFunctions),
		seenTypes:  map[string]bool{},
	}
}

func (c *profileMetrics) Start(context.Context, component.Host) error { return nil }
func (c *profileMetrics) Shutdown(context.Context) error              { return nil }

func (c *profileMetrics) Capabilities() consumer.Capabilities {
	return consumer.Capabilities{MutatesData: false}
}

// ConsumeProfiles adds pd's samples to the series and hands every series to
// the metrics pipeline.
func (c *profileMetrics) ConsumeProfiles(ctx context.Context, pd pprofile.Profiles) error {
	c.mu.Lock()
	now := c.now()
	// Expire first, so the programs of this export find room.
	if c.cfg.ExpireAfter > 0 {
		cutoff := now.Add(-c.cfg.ExpireAfter)
		for _, t := range []*table{c.samples, c.frameTypes, c.offCPU, c.functions} {
			t.expire(cutoff)
		}
	}
	c.add(pd, now)
	md := c.metrics(now)
	c.mu.Unlock()
	if md.DataPointCount() == 0 {
		return nil
	}
	if err := c.next.ConsumeMetrics(ctx, md); err != nil {
		return fmt.Errorf("profilemetrics connector: %w", err)
	}
	return nil
}

func (c *profileMetrics) add(pd pprofile.Profiles, now time.Time) {
	r := profileview.NewReader(pd)
	nres := len(c.cfg.ResourceAttributes)
	lastRes := -1
	for s := range r.Samples() {
		if s.ResourceIndex != lastRes {
			lastRes = s.ResourceIndex
			c.labels = c.labels[:0]
			for _, k := range c.cfg.ResourceAttributes {
				var val string
				if v, ok := s.Resource.Get(k); ok {
					val = v.AsString()
				}
				c.labels = append(c.labels, val)
			}
		}
		res := c.labels[:nres]
		switch {
		case s.Type == "samples" && s.Unit == "count":
			leaf := unknownType
			if len(s.Frames) > 0 {
				leaf = cmp.Or(s.Frames[0].Type, unknownType)
			}
			se, of := c.samples.get(append(res, leaf), now)
			c.warnOverflow(c.samples, of, "max_series")
			se.n += s.Value
			if s.PeriodUnit == "nanoseconds" && s.Period > 0 {
				se.f += float64(s.Value) * float64(s.Period) / 1e9
			}
			clear(c.seenTypes)
			for i := range s.Frames {
				t := cmp.Or(s.Frames[i].Type, unknownType)
				if c.seenTypes[t] {
					continue
				}
				c.seenTypes[t] = true
				ft, of := c.frameTypes.get(append(res, t), now)
				c.warnOverflow(c.frameTypes, of, "max_series")
				ft.n += s.Value
			}
			if c.cfg.TopFunctions > 0 {
				name, exe := "[no frames]", ""
				if len(s.Frames) > 0 {
					name = s.Frames[0].Name()
				}
				if v, ok := s.Resource.Get(attrExeName); ok {
					exe = v.AsString()
				}
				fn, of := c.functions.get([]string{exe, name, leaf}, now)
				c.warnOverflow(c.functions, of, "max_functions")
				fn.n += s.Value
			}
		case s.Type == "off_cpu" && s.Unit == "nanoseconds":
			oc, of := c.offCPU.get(res, now)
			c.warnOverflow(c.offCPU, of, "max_series")
			oc.f += float64(s.Value) / 1e9
		}
		c.labels = c.labels[:nres]
	}
}

// warnOverflow logs once per table that it is full; the overflow series
// counts the samples always.
func (c *profileMetrics) warnOverflow(t *table, overflowed bool, key string) {
	if overflowed && !t.warned {
		t.warned = true
		c.logger.Warn("profilemetrics connector: series table full; further keys are counted under otel.metric.overflow=true",
			zap.String("setting", key), zap.Int("bound", t.max))
	}
}

// metrics renders every series as cumulative sums; functions only the top
// TopFunctions by value, plus the overflow series.
func (c *profileMetrics) metrics(now time.Time) pmetric.Metrics {
	md := pmetric.NewMetrics()
	sm := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty()
	sm.Scope().SetName(scopeName)
	ts := pcommon.NewTimestampFromTime(now)
	emit := func(t *table, name, desc, unit string, float bool, list []*series) {
		if len(list) == 0 && t.overflow == nil {
			return
		}
		m := sm.Metrics().AppendEmpty()
		m.SetName(name)
		m.SetDescription(desc)
		m.SetUnit(unit)
		sum := m.SetEmptySum()
		sum.SetIsMonotonic(true)
		sum.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
		put := func(s *series, overflow bool) {
			dp := sum.DataPoints().AppendEmpty()
			dp.SetStartTimestamp(pcommon.NewTimestampFromTime(s.start))
			dp.SetTimestamp(ts)
			if float {
				dp.SetDoubleValue(s.f)
			} else {
				dp.SetIntValue(s.n)
			}
			if overflow {
				dp.Attributes().PutBool(attrOverflow, true)
				return
			}
			for i, k := range t.keys {
				if s.labels[i] != "" {
					dp.Attributes().PutStr(k, s.labels[i])
				}
			}
		}
		for _, s := range list {
			put(s, false)
		}
		if t.overflow != nil {
			put(t.overflow, true)
		}
	}
	sorted := func(t *table) []*series {
		list := make([]*series, 0, len(t.byKey))
		for _, s := range t.byKey {
			list = append(list, s)
		}
		slices.SortFunc(list, func(a, b *series) int {
			return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(b.f, a.f), slices.Compare(a.labels, b.labels))
		})
		return list
	}
	samples := sorted(c.samples)
	emit(c.samples, metricSamples, "On-CPU samples, by process and the frame type of the stack's leaf.", "{sample}", false, samples)
	emit(c.samples, metricCPUTime, "CPU time the on-CPU samples stand for (samples × sampling period), by process and leaf frame type.", "s", true, samples)
	emit(c.frameTypes, metricFrameTypes, "On-CPU samples whose stack has at least one frame of the type, by process and frame type.", "{sample}", false, sorted(c.frameTypes))
	emit(c.offCPU, metricOffCPU, "Time threads spent off the CPU in the off-CPU profile, by process.", "s", true, sorted(c.offCPU))
	if c.cfg.TopFunctions > 0 {
		fns := sorted(c.functions)
		emit(c.functions, metricFunctions, "On-CPU samples in which the function is the leaf (self), the top functions by count.", "{sample}", false,
			fns[:min(len(fns), c.cfg.TopFunctions)])
	}
	return md
}
