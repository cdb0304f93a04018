// Package uniformity holds the coarse statistical tests the secure-
// aggregation tests use to show that what a server receives looks like
// uniform ring words and is uncorrelated with the inputs. Tests only.
package uniformity

import (
	"fmt"
	"math"
	"math/bits"
)

// Problems applies coarse tests of uniformity to ring words: every bit
// position is set about half the time, the byte histogram passes a
// chi-squared test, and about half of all bits are set. Thresholds are far
// in the tails (false alarms below 1e-8). It returns what failed.
func Problems(y []uint64) []string {
	var problems []string
	nw := float64(len(y))
	var ones [64]int
	var hist [256]int
	pop := 0
	for _, w := range y {
		for b := range 64 {
			ones[b] += int(w >> b & 1)
		}
		for b := range 8 {
			hist[byte(w>>(8*b))]++
		}
		pop += bits.OnesCount64(w)
	}
	sd := math.Sqrt(nw / 4)
	for b, c := range ones {
		if math.Abs(float64(c)-nw/2) > 6.5*sd {
			problems = append(problems, fmt.Sprintf("bit %d set %d times of %d", b, c, len(y)))
		}
	}
	exp := nw * 8 / 256
	var chi2 float64
	for _, c := range hist {
		d := float64(c) - exp
		chi2 += d * d / exp
	}
	// 255 degrees of freedom: mean 255, sd ≈ 22.6; 400 is > 6 sd out.
	if chi2 > 400 {
		problems = append(problems, fmt.Sprintf("byte histogram chi² = %.1f (255 dof)", chi2))
	}
	if math.Abs(float64(pop)-nw*32) > 6.5*math.Sqrt(nw*16) {
		problems = append(problems, fmt.Sprintf("%d bits set of %d", pop, len(y)*64))
	}
	return problems
}

// Correlation is Pearson's r.
func Correlation(a, b []float64) float64 {
	var ma, mb float64
	for i := range a {
		ma += a[i]
		mb += b[i]
	}
	ma /= float64(len(a))
	mb /= float64(len(b))
	var sab, saa, sbb float64
	for i := range a {
		sab += (a[i] - ma) * (b[i] - mb)
		saa += (a[i] - ma) * (a[i] - ma)
		sbb += (b[i] - mb) * (b[i] - mb)
	}
	return sab / math.Sqrt(saa*sbb)
}

// Agreements counts the coordinates in which a masked vector y equals a
// plaintext encoding enc (both read as ring words). A mask leaves no
// coordinate as it was but by chance, so any agreement is worth a look.
func Agreements(y, enc []uint64) int {
	same := 0
	for i := range y {
		if y[i] == enc[i] {
			same++
		}
	}
	return same
}
