package profilemetricsconnector

import (
	"math/rand/v2"
	"testing"
	"time"

	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/profile"
)

// FuzzConsume feeds OTLP profiles from hostile bytes to the connector: it
// must not panic, and no table may outgrow its bound.
func FuzzConsume(f *testing.F) {
	var m pprofile.ProtoMarshaler
	seed, err := m.MarshalProfiles(build(gen(rand.New(rand.NewPCG(5, 6)), []*profile.Resource{{PID: 1, ExecutableName: "a"}, {PID: 2}}, 50, epoch), epoch))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte{})
	var um pprofile.ProtoUnmarshaler
	f.Fuzz(func(t *testing.T, data []byte) {
		pd, err := um.UnmarshalProfiles(data)
		if err != nil {
			return
		}
		cfg := createDefaultConfig()
		cfg.MaxSeries, cfg.MaxFunctions, cfg.TopFunctions = 3, 3, 2
		c := newConnector(cfg, zap.NewNop(), &consumertest.MetricsSink{}, time.Now)
		if err := c.ConsumeProfiles(t.Context(), pd); err != nil {
			t.Fatal(err)
		}
		for _, tb := range []*table{c.samples, c.frameTypes, c.offCPU, c.functions} {
			if len(tb.byKey) > tb.max {
				t.Fatalf("table of %v holds %d series, bound %d", tb.keys, len(tb.byKey), tb.max)
			}
		}
	})
}
