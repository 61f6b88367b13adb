package collector

import (
	"go.opentelemetry.io/collector/receiver/xreceiver"

	"github.com/sonde-dev/sonde/tracer"
)

// Hooks for this package's external tests into a started receiver.

// TracerOf returns the receiver's tracer.
func TracerOf(r xreceiver.Profiles) *tracer.Tracer { return r.(*profilesReceiver).tracer }

// PreparerGone returns how many processes the receiver found gone while
// preparing them.
func PreparerGone(r xreceiver.Profiles) uint64 { return r.(*profilesReceiver).preparer.gone.Load() }

// PreparerProgress returns how many requests the receiver's preparer
// accepted and how many it has handled, in order.
func PreparerProgress(r xreceiver.Profiles) (queued, handled uint64) {
	p := r.(*profilesReceiver).preparer
	return p.queued.Load(), p.handled.Load()
}
