// Package viz draws results for people: a heatmap of a metric over a
// two-parameter grid sweep, as a PNG (gonum/plot) and as a small terminal
// table. It reads plain result values and never changes them.
package viz

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/palette/moreland"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Cell is one shard's position in a two-parameter sweep and its metric.
type Cell struct {
	Params map[string]any
	Value  any
}

// Grid is a metric laid out over two parameters.
type Grid struct {
	Metric       string
	XName, YName string
	X, Y         []any       // sorted distinct parameter values
	Z            [][]float64 // Z[y][x]; NaN where no shard
}

// preferredMetrics are tried in order when the job names none.
var preferredMetrics = []string{"auc", "accuracy", "rmse", "log_loss", "loss"}

// DetectGrid lays cells out as a heatmap when they form a two-parameter
// sweep whose values are dicts holding a numeric metric. metric may be ""
// to pick a familiar one. ok is false when the cells are not such a sweep.
func DetectGrid(cells []Cell, metric string) (*Grid, bool) {
	if len(cells) < 2 {
		return nil, false
	}
	params := make([]map[string]any, len(cells))
	for i, c := range cells {
		params[i] = c.Params
	}
	first, ok := cells[0].Value.(map[string]any)
	if !ok {
		return nil, false
	}
	if metric = PickMetric(first, metric); metric == "" {
		return nil, false
	}
	g, ok := NewGrid(params, metric)
	if !ok {
		return nil, false
	}
	for _, c := range cells {
		if !g.Set(c.Params, c.Value) {
			return nil, false
		}
	}
	return g, true
}

// PickMetric returns metric when it is set, else the first familiar metric
// (auc, accuracy, rmse, log_loss, loss) or the first numeric key of value,
// or "" when value holds no number.
func PickMetric(value map[string]any, metric string) string {
	if metric != "" {
		return metric
	}
	for _, m := range preferredMetrics {
		if _, ok := number(value[m]); ok {
			return m
		}
	}
	for _, k := range sortedKeys(value) {
		if _, ok := number(value[k]); ok {
			return k
		}
	}
	return ""
}

// NewGrid lays out an empty grid (every cell NaN) over the shards'
// parameters, before any result is known, so a live view can fill it cell
// by cell. ok is false unless every shard has the same two parameters,
// each with at least two distinct values.
func NewGrid(params []map[string]any, metric string) (*Grid, bool) {
	if len(params) < 2 {
		return nil, false
	}
	keys := sortedKeys(params[0])
	if len(keys) != 2 {
		return nil, false
	}
	cells := make([]Cell, len(params))
	for i, p := range params {
		if k := sortedKeys(p); len(k) != 2 || k[0] != keys[0] || k[1] != keys[1] {
			return nil, false
		}
		cells[i] = Cell{Params: p}
	}
	g := &Grid{Metric: metric, XName: keys[0], YName: keys[1]}
	g.X = distinct(cells, keys[0])
	g.Y = distinct(cells, keys[1])
	if len(g.X) < 2 || len(g.Y) < 2 {
		return nil, false
	}
	g.Z = make([][]float64, len(g.Y))
	for i := range g.Z {
		g.Z[i] = make([]float64, len(g.X))
		for j := range g.Z[i] {
			g.Z[i][j] = math.NaN()
		}
	}
	return g, true
}

// Pos returns the column and row of a shard's parameters in the grid.
func (g *Grid) Pos(params map[string]any) (x, y int) {
	return indexOf(g.X, params[g.XName]), indexOf(g.Y, params[g.YName])
}

// Set fills the cell of params with value's metric; false when value is
// not a dict with a numeric metric or params are not on the grid.
func (g *Grid) Set(params map[string]any, value any) bool {
	m, ok := value.(map[string]any)
	if !ok {
		return false
	}
	v, ok := number(m[g.Metric])
	if !ok {
		return false
	}
	x, y := g.Pos(params)
	if x < 0 || y < 0 {
		return false
	}
	g.Z[y][x] = v
	return true
}

// Number reads a result value's number (float or integer).
func Number(v any) (float64, bool) { return number(v) }

func sortedKeys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int64:
		return float64(x), true
	case int:
		return float64(x), true
	case uint64:
		return float64(x), true
	}
	return 0, false
}

func distinct(cells []Cell, key string) []any {
	var out []any
	for _, c := range cells {
		if indexOf(out, c.Params[key]) < 0 {
			out = append(out, c.Params[key])
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, aok := number(out[i])
		b, bok := number(out[j])
		if aok && bok {
			return a < b
		}
		return fmt.Sprint(out[i]) < fmt.Sprint(out[j])
	})
	return out
}

func indexOf(list []any, v any) int {
	for i, x := range list {
		if fmt.Sprint(x) == fmt.Sprint(v) {
			return i
		}
	}
	return -1
}

func (g *Grid) bounds() (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, row := range g.Z {
		for _, v := range row {
			if !math.IsNaN(v) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	return lo, hi
}

// shades from low to high, for terminals without colour.
var shades = []string{" ", "░", "▒", "▓", "█"}

// Terminal prints the grid as a table: each cell its value and a shade.
func (g *Grid) Terminal(w io.Writer) {
	lo, hi := g.bounds()
	fmt.Fprintf(w, "%s by %s (rows) × %s (columns); darker is higher\n", g.Metric, g.YName, g.XName)
	labelW := len(g.YName)
	for _, y := range g.Y {
		labelW = max(labelW, len(fmt.Sprint(y)))
	}
	fmt.Fprintf(w, "%*s", labelW, "")
	for _, x := range g.X {
		fmt.Fprintf(w, " %10s", trunc(fmt.Sprint(x), 10))
	}
	fmt.Fprintln(w)
	for i, y := range g.Y {
		fmt.Fprintf(w, "%*s", labelW, fmt.Sprint(y))
		for j := range g.X {
			v := g.Z[i][j]
			if math.IsNaN(v) {
				fmt.Fprintf(w, " %10s", "-")
				continue
			}
			var s string
			if hi > lo {
				s = shades[int(math.Round((v-lo)/(hi-lo)*float64(len(shades)-1)))]
			} else {
				s = shades[len(shades)-1]
			}
			fmt.Fprintf(w, " %s%s %7.4f", s, s, v)
		}
		fmt.Fprintln(w)
	}
}

func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// gridXYZ adapts Grid to plotter.GridXYZ on integer cell positions.
type gridXYZ struct{ g *Grid }

func (a gridXYZ) Dims() (c, r int)   { return len(a.g.X), len(a.g.Y) }
func (a gridXYZ) Z(c, r int) float64 { return a.g.Z[r][c] }
func (a gridXYZ) X(c int) float64    { return float64(c) }
func (a gridXYZ) Y(r int) float64    { return float64(r) }

// PNG renders the heatmap with a legend of the metric's range.
func (g *Grid) PNG(path string) error {
	lo, hi := g.bounds()
	if hi <= lo {
		hi = lo + 1e-9
	}
	pal := moreland.SmoothBlueRed()
	pal.SetMin(lo)
	pal.SetMax(hi)
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s over %s × %s (range %.4g – %.4g)", g.Metric, g.XName, g.YName, lo, hi)
	p.X.Label.Text = g.XName
	p.Y.Label.Text = g.YName
	hm := plotter.NewHeatMap(gridXYZ{g}, pal.Palette(64))
	hm.NaN = color.Gray{Y: 200}
	p.Add(hm)
	p.X.Tick.Marker = labels(g.X)
	p.Y.Tick.Marker = labels(g.Y)
	p.X.Min, p.X.Max = -0.5, float64(len(g.X))-0.5
	p.Y.Min, p.Y.Max = -0.5, float64(len(g.Y))-0.5
	for i := range g.Y {
		for j := range g.X {
			if math.IsNaN(g.Z[i][j]) {
				continue
			}
			l, err := plotter.NewLabels(plotter.XYLabels{
				XYs:    plotter.XYs{{X: float64(j), Y: float64(i)}},
				Labels: []string{fmt.Sprintf("%.3g", g.Z[i][j])},
			})
			if err == nil {
				p.Add(l)
			}
		}
	}
	return p.Save(vg.Length(120+70*len(g.X))*vg.Points(1), vg.Length(100+45*len(g.Y))*vg.Points(1), path)
}

func labels(vals []any) plot.ConstantTicks {
	t := make(plot.ConstantTicks, len(vals))
	for i, v := range vals {
		t[i] = plot.Tick{Value: float64(i), Label: strings.TrimSpace(fmt.Sprint(v))}
	}
	return t
}
