//go:build race

package he

// raceEnabled: under the race detector lattigo's polynomial loops run
// ~20× slower, so the exhaustive n sweep runs without -race only (CI's
// -race run keeps n = 6, which covers both dropout paths; the package
// then takes ~20 s under -race on two busy cores, ~3 s without).
const raceEnabled = true
