//go:build !race

package he

const raceEnabled = false
