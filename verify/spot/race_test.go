//go:build race

package spot

// raceEnabled shrinks the simulations under the race detector, which
// slows them tenfold without checking anything more (they are sequential).
const raceEnabled = true
