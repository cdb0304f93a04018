package memlimit

import (
	"testing"

	"github.com/scellis/scellis/internal/testharness"
)

func TestMain(m *testing.M) { testharness.Main(m) }
