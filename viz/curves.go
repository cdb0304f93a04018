package viz

import (
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Series is one named curve: Y over X (a training run's rounds).
type Series struct {
	Name string
	X, Y []float64
}

// palette colours the curves in order.
var palette = []color.RGBA{{31, 95, 191, 255}, {198, 40, 40, 255}, {46, 125, 50, 255}, {178, 106, 0, 255}}

// CurvesPNG draws two panels side by side — losses on the left, other
// metrics (accuracy) on the right — each series as a line with points,
// and saves them as a PNG. A panel with no points is left empty.
func CurvesPNG(path, title string, left, right []Series) error {
	const w, h = 9 * vg.Inch, 3.6 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 6, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	for i, panel := range [][]Series{left, right} {
		p := plot.New()
		p.Title.Text = title
		if i == 1 {
			p.Title.Text = "held-out metric"
		}
		p.X.Label.Text = "round"
		p.Legend.Top = true
		for k, s := range panel {
			if len(s.X) == 0 {
				continue
			}
			pts := make(plotter.XYs, len(s.X))
			for j := range s.X {
				pts[j].X, pts[j].Y = s.X[j], s.Y[j]
			}
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				return err
			}
			c := palette[(k+2*i)%len(palette)]
			line.Color, points.Color = c, c
			p.Add(line, points)
			p.Legend.Add(s.Name, line, points)
		}
		p.Draw(tiles.At(dc, i, 0))
	}
	return savePNG(img, path)
}

// savePNG writes img to path as a PNG.
func savePNG(img *vgimg.Canvas, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
