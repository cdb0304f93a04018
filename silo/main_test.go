package silo_test

import (
	"testing"

	"github.com/scellis/scellis/internal/testharness"
)

// Nothing the tests start or make outlives them (internal/testharness).
func TestMain(m *testing.M) { testharness.Main(m) }
