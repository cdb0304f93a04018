package datagen

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/mat"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/model"
)

// Shape of the glyph images.
const (
	GlyphSide    = 16
	GlyphPixels  = GlyphSide * GlyphSide
	GlyphClasses = 10
	// GlyphLabel is the label column of glyph data.
	GlyphLabel = "label"
)

// sevenSegments lists, for each digit, its lit segments of a seven-segment
// display: a top, b top right, c bottom right, d bottom, e bottom left,
// f top left, g middle.
var sevenSegments = [GlyphClasses]string{"abcdef", "bc", "abdeg", "abcdg", "bcfg", "acdfg", "acdefg", "abc", "abcdefg", "abcdfg"}

// Glyphs generates a small image dataset: 16×16 grayscale seven-segment
// digits 0–9, each drawn with a random shift (±2 pixels), stroke width
// (1–2), intensity (0.5–1), a 2% chance per segment of being left out and
// Gaussian pixel noise (σ 0.15), pixels clipped to [0, 1] and rounded to two
// decimals. Columns p0 … p255 (row-major) and the label.
//
// The split is non-IID by label: site k draws a fraction skew of its rows
// from its own three classes (2k, 2k+1, 2k+2 mod 10) and the rest
// uniformly from all ten. Sites are named site-1 … site-N. test rows, drawn
// uniformly over the classes from their own stream, form a held-out set
// (Site "test"; none when test is 0).
func Glyphs(sites, rows, test int, skew float64, seed uint64) (train []Site, held *Site, err error) {
	if sites < 1 || sites > 1000 || rows < 1 || rows > 1<<20 || test < 0 || test > 1<<20 {
		return nil, nil, diag.New(diag.InvalidValue, "datagen glyphs", "sites %d, rows %d, test %d out of range (1..1000 sites, 1..2^20 rows per site, 0..2^20 test rows)", sites, rows, test).
			WithHelp("for a quick federation: --sites 4 --rows 300 --test 500")
	}
	if !(skew >= 0 && skew <= 1) {
		return nil, nil, diag.New(diag.InvalidValue, "datagen glyphs", "skew %v is outside [0, 1]", skew).
			WithHelp("0 is IID; 1 gives each site only its own three classes")
	}
	for k := range sites {
		r := newRand(seed, fmt.Sprintf("glyphs/site/%d", k))
		own := []int{(2 * k) % 10, (2*k + 1) % 10, (2*k + 2) % 10}
		train = append(train, Site{Name: siteName("site", k, sites), Data: glyphRows(r, rows, func() int {
			if r.Float64() < skew {
				return own[r.IntN(len(own))]
			}
			return r.IntN(GlyphClasses)
		})})
	}
	if test > 0 {
		r := newRand(seed, "glyphs/test")
		held = &Site{Name: "test", Data: glyphRows(r, test, func() int { return r.IntN(GlyphClasses) })}
	}
	return train, held, nil
}

func glyphRows(r interface {
	Float64() float64
	IntN(int) int
	NormFloat64() float64
}, n int, class func() int) *model.Dataset {
	features := make([]string, GlyphPixels)
	for i := range features {
		features[i] = fmt.Sprintf("p%d", i)
	}
	x := mat.NewDense(n, GlyphPixels, nil)
	y := make([]float64, n)
	img := make([]float64, GlyphPixels)
	for i := range n {
		c := class()
		y[i] = float64(c)
		clear(img)
		dx, dy := r.IntN(5)-2, r.IntN(5)-2
		width := 1 + r.IntN(2)
		ink := 0.5 + 0.5*r.Float64()
		for _, seg := range sevenSegments[c] {
			if r.Float64() < 0.02 {
				continue
			}
			drawSegment(img, seg, 4+dx, 2+dy, width, ink)
		}
		row := x.RawRowView(i)
		for p, v := range img {
			v += 0.15 * r.NormFloat64()
			row[p] = math.Round(100*math.Min(1, math.Max(0, v))) / 100
		}
	}
	return &model.Dataset{Name: "glyphs", Features: features, Label: GlyphLabel, X: x, Y: y}
}

// drawSegment inks one segment of a seven-segment digit whose 8×12 box
// has its top-left corner at (x0, y0).
func drawSegment(img []float64, seg rune, x0, y0, width int, ink float64) {
	const w, h = 7, 12
	var xa, ya, xb, yb int
	switch seg {
	case 'a':
		xa, ya, xb, yb = 0, 0, w, 0
	case 'b':
		xa, ya, xb, yb = w, 0, w, h/2
	case 'c':
		xa, ya, xb, yb = w, h/2, w, h
	case 'd':
		xa, ya, xb, yb = 0, h, w, h
	case 'e':
		xa, ya, xb, yb = 0, h/2, 0, h
	case 'f':
		xa, ya, xb, yb = 0, 0, 0, h/2
	case 'g':
		xa, ya, xb, yb = 0, h/2, w, h/2
	}
	for px := xa; px <= xb; px++ {
		for py := ya; py <= yb; py++ {
			for t := range width {
				X, Y := x0+px, y0+py
				if xa == xb {
					X += t
				} else {
					Y += t
				}
				if X >= 0 && X < GlyphSide && Y >= 0 && Y < GlyphSide {
					img[Y*GlyphSide+X] = ink
				}
			}
		}
	}
}
