//go:build !unix

package consensus

import "time"

// cpuTime is unavailable here: the benchmarks then report no CPU figures.
func cpuTime() (time.Duration, bool) { return 0, false }
