package aggregator

import (
	"testing"

	"github.com/scellis/scellis/internal/sandboxproc"
	"github.com/scellis/scellis/internal/testharness"
)

// The planner re-executes this binary to run content under OS limits: as
// a child, the test binary runs the handler and exits.
func TestMain(m *testing.M) {
	sandboxproc.Main()
	testharness.Main(m) // nothing the tests start or make outlives them
}
