package aggregator

import (
	"os"
	"testing"

	"github.com/scellis/scellis/internal/sandboxproc"
)

// The planner re-executes this binary to run content under OS limits: as
// a child, the test binary runs the handler and exits.
func TestMain(m *testing.M) {
	sandboxproc.Main()
	os.Exit(m.Run())
}
