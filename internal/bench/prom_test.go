package bench

import (
	"bufio"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The distribution's own figures come from its Collector telemetry, served
// by a Prometheus reader: what a user scraping the agent sees. Only the
// text exposition format is read, and only what the bench needs of it.

// promSeries is one sample line: a metric name, its labels and its value.
type promSeries struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// promScrape is one scrape of the endpoint.
type promScrape []promSeries

// parseProm reads the text exposition format: comments and blank lines
// are skipped, every other line is name{labels} value [timestamp].
func parseProm(text string) (promScrape, error) {
	var out promScrape
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parsePromLine(line)
		if err != nil {
			return nil, fmt.Errorf("exposition line %d: %w", n, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func parsePromLine(line string) (promSeries, error) {
	s := promSeries{Labels: map[string]string{}}
	i := strings.IndexAny(line, "{ \t")
	if i <= 0 {
		return s, fmt.Errorf("no value in %q", line)
	}
	s.Name, line = line[:i], line[i:]
	if line[0] == '{' {
		rest, err := parsePromLabels(line[1:], s.Labels)
		if err != nil {
			return s, fmt.Errorf("%s: %w", s.Name, err)
		}
		line = rest
	}
	fields := strings.Fields(line)
	if len(fields) == 0 || len(fields) > 2 {
		return s, fmt.Errorf("%s: want a value and an optional timestamp, got %q", s.Name, line)
	}
	v, err := strconv.ParseFloat(fields[0], 64) // also NaN, +Inf, -Inf
	if err != nil {
		return s, fmt.Errorf("%s: value: %w", s.Name, err)
	}
	s.Value = v
	return s, nil
}

// parsePromLabels reads name="value" pairs up to the closing brace into
// into and returns what follows it. Values may hold escaped \\, \" and \n.
func parsePromLabels(s string, into map[string]string) (string, error) {
	for {
		s = strings.TrimLeft(s, " \t,")
		if s == "" {
			return "", fmt.Errorf("labels not closed")
		}
		if s[0] == '}' {
			return s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return "", fmt.Errorf("bad label at %q", s)
		}
		name := strings.TrimSpace(s[:eq])
		var val strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[i])
				}
				continue
			}
			val.WriteByte(s[i])
		}
		if i >= len(s) {
			return "", fmt.Errorf("label %s: value not closed", name)
		}
		into[name] = val.String()
		s = s[i+1:]
	}
}

// promName is the exposition name of an OpenTelemetry metric name.
func promName(otel string) string { return strings.NewReplacer(".", "_", "-", "_").Replace(otel) }

// The exporter adds the unit and, to counters, _total to the name; the
// bench looks a metric up under each form it may take.
var promSuffixes = []string{"", "_total", "_bytes", "_bytes_total", "_seconds", "_seconds_total"}

// has reports whether any series of the metric is present.
func (p promScrape) has(otel string) bool {
	_, ok := p.sum(otel)
	return ok
}

// sum adds the series of an OpenTelemetry metric whose labels include
// every key=value in attrs; ok is false when the metric is absent.
func (p promScrape) sum(otel string, attrs ...string) (v float64, ok bool) {
	base := promName(otel)
	for _, s := range p {
		rest, found := strings.CutPrefix(s.Name, base)
		if !found || !slices.Contains(promSuffixes, rest) {
			continue
		}
		ok = true
		if s.matches(attrs) {
			v += s.Value
		}
	}
	return v, ok
}

func (s promSeries) matches(attrs []string) bool {
	for _, a := range attrs {
		k, v, _ := strings.Cut(a, "=")
		if s.Labels[k] != v {
			return false
		}
	}
	return true
}

// byLabel sums an OpenTelemetry metric's series by the value of one label.
func (p promScrape) byLabel(otel, label string) map[string]float64 {
	base := promName(otel)
	out := map[string]float64{}
	for _, s := range p {
		rest, found := strings.CutPrefix(s.Name, base)
		if found && slices.Contains(promSuffixes, rest) {
			out[s.Labels[label]] += s.Value
		}
	}
	return out
}

// sonde returns every sonde_* series as flat keys with sorted labels, for
// the results file. The scope labels the exporter adds are left out.
func (p promScrape) sonde() map[string]float64 {
	out := map[string]float64{}
	for _, s := range p {
		if !strings.HasPrefix(s.Name, "sonde_") {
			continue
		}
		var kv []string
		for k, v := range s.Labels {
			if !strings.HasPrefix(k, "otel_scope_") {
				kv = append(kv, k+"="+v)
			}
		}
		slices.Sort(kv)
		key := s.Name
		if len(kv) > 0 {
			key += "{" + strings.Join(kv, ",") + "}"
		}
		out[key] += s.Value
	}
	return out
}

// find returns the name of the first sonde_* series matching re (nil for
// none): for figures whose metric other parts of the project are adding
// and whose exact name the bench does not assume.
func (p promScrape) find(re *regexp.Regexp) string {
	var names []string
	for _, s := range p {
		if strings.HasPrefix(s.Name, "sonde_") && re.MatchString(s.Name) {
			names = append(names, s.Name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	slices.Sort(names)
	return names[0]
}

// value sums the series of an exact exposition name.
func (p promScrape) value(name string) float64 {
	var v float64
	for _, s := range p {
		if s.Name == name {
			v += s.Value
		}
	}
	return v
}

// secondsOf is the factor that turns a value of the named series into
// seconds, from the unit suffix the exporter gave it; seconds if none.
func secondsOf(name string) float64 {
	name = strings.TrimSuffix(strings.TrimSuffix(name, "_total"), "_bucket")
	switch {
	case strings.HasSuffix(name, "_milliseconds"), strings.HasSuffix(name, "_ms"):
		return 1e-3
	case strings.HasSuffix(name, "_microseconds"), strings.HasSuffix(name, "_us"):
		return 1e-6
	case strings.HasSuffix(name, "_nanoseconds"), strings.HasSuffix(name, "_ns"):
		return 1e-9
	}
	return 1
}

// histogram is the buckets of one histogram family, summed over labels.
type histogram struct {
	Name   string // the family, without _bucket
	Bounds []float64
	Counts []float64 // cumulative, as exposed; the last bound is +Inf
	Count  float64
}

// histogram gathers the family whose buckets are named bucketName.
func (p promScrape) histogram(bucketName string) histogram {
	h := histogram{Name: strings.TrimSuffix(bucketName, "_bucket")}
	byBound := map[float64]float64{}
	for _, s := range p {
		if s.Name != bucketName {
			continue
		}
		le, err := strconv.ParseFloat(s.Labels["le"], 64)
		if err != nil {
			continue
		}
		byBound[le] += s.Value
	}
	for le := range byBound {
		h.Bounds = append(h.Bounds, le)
	}
	slices.Sort(h.Bounds)
	for _, le := range h.Bounds {
		h.Counts = append(h.Counts, byBound[le])
	}
	if n := len(h.Counts); n > 0 {
		h.Count = h.Counts[n-1]
	}
	return h
}

// minus is h with the counts of an earlier scrape taken away: the
// observations made between the two.
func (h histogram) minus(earlier histogram) histogram {
	out := histogram{Name: h.Name, Bounds: h.Bounds, Counts: slices.Clone(h.Counts)}
	for i, le := range h.Bounds {
		if j := slices.Index(earlier.Bounds, le); j >= 0 {
			out.Counts[i] -= earlier.Counts[j]
		}
	}
	if n := len(out.Counts); n > 0 {
		out.Count = out.Counts[n-1]
	}
	return out
}

// quantile estimates the q-quantile by linear interpolation inside the
// bucket that holds it, as Prometheus does; an observation above the last
// finite bound counts as that bound. ok is false with no observations.
func (h histogram) quantile(q float64) (v float64, ok bool) {
	if h.Count <= 0 || len(h.Bounds) == 0 {
		return 0, false
	}
	rank := q * h.Count
	lower, below := 0.0, 0.0
	for i, le := range h.Bounds {
		if h.Counts[i] >= rank {
			if math.IsInf(le, 1) {
				return lower, true
			}
			in := h.Counts[i] - below
			if in <= 0 {
				return le, true
			}
			return lower + (le-lower)*(rank-below)/in, true
		}
		lower, below = le, h.Counts[i]
	}
	return lower, true
}

func TestParseProm(t *testing.T) {
	const text = `# HELP sonde_samples_received_total Sample records the receiver read.
# TYPE sonde_samples_received_total counter
sonde_samples_received_total{otel_scope_name="github.com/sonde-dev/sonde/collector"} 1234
sonde_samples_lost_total{reason="ring_buffer_full",otel_scope_name="x"} 3
sonde_samples_lost_total{otel_scope_name="x",reason="interval_full"} 4
sonde_unwind_table_size_bytes 2.5e+06
odd{path="a \"quoted\", \\ value",b="x"} 7 1700000000000
sonde_table_delay_seconds_bucket{le="0.001"} 2
sonde_table_delay_seconds_bucket{le="0.01"} 6
sonde_table_delay_seconds_bucket{le="0.1"} 10
sonde_table_delay_seconds_bucket{le="+Inf"} 10
`
	p, err := parseProm(text)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		attrs []string
		want  float64
	}{
		{"sonde.samples.received", nil, 1234},
		{"sonde.samples.lost", nil, 7},
		{"sonde.samples.lost", []string{"reason=interval_full"}, 4},
		{"sonde.unwind.table.size", nil, 2.5e6},
	} {
		t.Run(strings.TrimSpace(c.name+" "+strings.Join(c.attrs, ",")), func(t *testing.T) {
			got, ok := p.sum(c.name, c.attrs...)
			if !ok || got != c.want {
				t.Errorf("sum = %v, %v; want %v, true", got, ok, c.want)
			}
		})
	}
	if p.has("sonde.samples") {
		t.Error("a prefix of a metric's name matched it")
	}
	if got := p.value("odd"); got != 7 {
		t.Errorf("odd = %v, want 7", got)
	}
	for _, s := range p {
		if s.Name == "odd" && (s.Labels["path"] != `a "quoted", \ value` || s.Labels["b"] != "x") {
			t.Errorf("escaped labels read as %q", s.Labels)
		}
	}
	if got := p.sonde()["sonde_samples_lost_total{reason=ring_buffer_full}"]; got != 3 {
		t.Errorf("flat key of a labelled series = %v, want 3", got)
	}
	if got := p.find(regexp.MustCompile(`delay`)); got != "sonde_table_delay_seconds_bucket" {
		t.Errorf("find = %q", got)
	}

	h := p.histogram("sonde_table_delay_seconds_bucket")
	if h.Count != 10 {
		t.Fatalf("histogram count = %v, want 10", h.Count)
	}
	// Rank 5 of 10 is the third of the four observations in (0.001, 0.01].
	if got, ok := h.quantile(0.5); !ok || math.Abs(got-0.00775) > 1e-9 {
		t.Errorf("median = %v, %v; want 0.00775", got, ok)
	}
	d := h.minus(histogram{Bounds: []float64{0.001, 0.01, 0.1, math.Inf(1)}, Counts: []float64{2, 6, 6, 6}})
	if got, ok := d.quantile(0.99); d.Count != 4 || !ok || got <= 0.01 || got > 0.1 {
		t.Errorf("p99 of the later observations = %v, %v (count %v); want within (0.01, 0.1]", got, ok, d.Count)
	}
	if _, ok := (histogram{}).quantile(0.5); ok {
		t.Error("a quantile of no observations")
	}

	for _, bad := range []string{"name", `x{a="b} 1`, `x{a=b} 1`, "x one", "x 1 2 3"} {
		if _, err := parseProm(bad); err == nil {
			t.Errorf("parseProm(%q) did not fail", bad)
		}
	}
}
