package kubernetes

import (
	"os"
	"testing"

	"github.com/scellis/scellis/deploy/internal/testbin"
)

func TestMain(m *testing.M) { os.Exit(testbin.Main(m)) }
