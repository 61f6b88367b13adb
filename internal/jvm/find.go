package jvm

import (
	"fmt"

	"github.com/sonde-dev/sonde/internal/process"
)

// layout is what the JVM's tables say about its structures.
type layout struct{}

// Find locates the JVM in p and reads its layout from mem (p's memory).
// A process that maps no libjvm.so matches ErrNotJVM; a JVM whose tables
// lack a needed entry matches ErrUnknownVersion.
func Find(p *process.Process, mem Memory) (*VM, error) {
	return nil, fmt.Errorf("jvm %d: %w", p.PID, ErrNotJVM)
}
