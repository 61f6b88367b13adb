package sqliteexporter

import (
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/exporter/sqliteexporter/internal/metadata"
)

// FuzzWrite feeds OTLP profiles from hostile bytes (what a pipeline fed by
// an OTLP receiver may carry) to the exporter: it must not panic, and a
// write it reports committed must leave as many sample rows as the export
// had samples with a valid stack.
func FuzzWrite(f *testing.F) {
	var m pprofile.ProtoMarshaler
	seed, err := m.MarshalProfiles(intervals(9, 1, 20)[0])
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte{})
	cfg := createDefaultConfig()
	cfg.Path = filepath.Join(f.TempDir(), "fuzz.db")
	cfg.MaxAge, cfg.MaxSizeMiB = 0, 64
	tb, err := metadata.NewTelemetryBuilder(componenttest.NewNopTelemetrySettings())
	if err != nil {
		f.Fatal(err)
	}
	e := newExporter(cfg, zap.NewNop(), tb, time.Now)
	if err := e.start(f.Context(), componenttest.NewNopHost()); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = e.shutdown(f.Context()) })
	var um pprofile.ProtoUnmarshaler
	f.Fuzz(func(t *testing.T, data []byte) {
		pd, err := um.UnmarshalProfiles(data)
		if err != nil {
			return
		}
		var before int64
		if err := e.db.QueryRow("SELECT count(*) FROM samples").Scan(&before); err != nil {
			t.Fatal(err)
		}
		if err := e.consumeProfiles(t.Context(), pd); err != nil {
			return
		}
		var after int64
		if err := e.db.QueryRow("SELECT count(*) FROM samples").Scan(&after); err != nil {
			t.Fatal(err)
		}
		want := int64(0)
		dict := pd.Dictionary()
		for _, rp := range pd.ResourceProfiles().All() {
			for _, sp := range rp.ScopeProfiles().All() {
				for _, p := range sp.Profiles().All() {
					for _, s := range p.Samples().All() {
						if si := s.StackIndex(); si >= 0 && int(si) < dict.StackTable().Len() {
							want++
						}
					}
				}
			}
		}
		if after-before != want {
			t.Fatalf("export committed %d sample rows, want %d", after-before, want)
		}
	})
}
