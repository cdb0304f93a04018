//go:build !race

package spot

const raceEnabled = false
