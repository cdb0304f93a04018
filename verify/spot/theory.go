package spot

import "math"

// DetectionPerLie is the probability that one wrong result is caught
// directly: it is audited (probability audit) by an auditor who is not an
// accomplice (probability 1−accomplice), or it falls on a canary
// (probability canary).
func DetectionPerLie(audit, accomplice, canary float64) float64 {
	return 1 - (1-audit*(1-accomplice))*(1-canary)
}

// Survival is the probability that a cheater who tells lies wrong results,
// each caught with probability perLie, is never caught: (1−perLie)^lies.
// Once caught, its window is re-checked, so its earlier lies are replaced
// too; a cheater who survives is the only source of accepted wrong results.
func Survival(perLie float64, lies int) float64 {
	return math.Pow(1-perLie, float64(lies))
}

// SurvivalRandom is the probability that a cheater who lies on each of
// shards results independently with probability q is never caught:
// (1 − q·perLie)^shards.
func SurvivalRandom(q, perLie float64, shards int) float64 {
	return math.Pow(1-q*perLie, float64(shards))
}
