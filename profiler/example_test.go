package profiler_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/sonde-dev/sonde/profiler"
)

// spin burns CPU until ctx ends.
func spin(ctx context.Context) {
	for n := 0; ctx.Err() == nil; n++ {
		for i := range 1 << 16 {
			n ^= i
		}
	}
}

// Profile the whole host for three seconds without the Collector, while
// this process burns CPU in spin, and look for spin in what is emitted. It
// needs root (or CAP_BPF and CAP_PERFMON); TestExample runs it.
func Example() {
	opts := profiler.DefaultOptions()
	opts.SamplesPerSecond = 99
	opts.ReporterInterval = time.Second
	p, err := profiler.New(opts)
	if err != nil {
		fmt.Println("cannot profile this host:", err)
		return
	}
	defer func() {
		if err := p.Close(); err != nil {
			fmt.Println("close:", err)
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	go spin(ctx)

	var intervals, own int
	var spinNamed bool
	err = p.Run(ctx, func(_ context.Context, pd pprofile.Profiles) error {
		intervals++
		dict := pd.Dictionary()
		for _, rp := range pd.ResourceProfiles().All() {
			pid, _ := rp.Resource().Attributes().Get("process.pid")
			if pid.Int() != int64(os.Getpid()) {
				continue
			}
			for _, sp := range rp.ScopeProfiles().All() {
				for _, prof := range sp.Profiles().All() {
					for _, s := range prof.Samples().All() {
						own += s.TimestampsUnixNano().Len()
						stack := dict.StackTable().At(int(s.StackIndex()))
						for _, li := range stack.LocationIndices().All() {
							for _, ln := range dict.LocationTable().At(int(li)).Lines().All() {
								fn := dict.FunctionTable().At(int(ln.FunctionIndex()))
								name := dict.StringTable().At(int(fn.NameStrindex()))
								spinNamed = spinNamed || strings.HasSuffix(name, "profiler_test.spin")
							}
						}
					}
				}
			}
		}
		return nil
	})
	fmt.Println("run:", err)
	fmt.Println("intervals emitted:", intervals > 0)
	fmt.Println("samples of this process:", own > 0)
	fmt.Println("spin named:", spinNamed)
	st := p.Stats()
	fmt.Println("every sample counted:", st.Samples >= uint64(own) && st.EmittedSamples >= uint64(own))
}
