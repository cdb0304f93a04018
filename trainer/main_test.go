package trainer_test

import (
	"testing"

	"github.com/scellis/scellis/internal/testharness"
	"github.com/scellis/scellis/trainer"
)

// The sandbox's first process is this test binary, re-executed; nothing
// the tests start or make outlives them (internal/testharness).
func TestMain(m *testing.M) {
	trainer.Main()
	testharness.Main(m)
}
