//go:build !unix

package secagg

import "time"

// cpuTime is not measured here: the benchmarks report wall-time ratios only.
func cpuTime() (time.Duration, bool) { return 0, false }
