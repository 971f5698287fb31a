package ui

import (
	"math"
	"strconv"
	"strings"
)

// The charts of the training view are drawn on the server as inline SVG:
// no script, no library. Coordinates are computed here; the template
// (training.html, "chart") only places them, so every label and value
// reaches the page through html/template's escaping. Each bar and point
// carries its step and value in data- attributes (the browser test reads
// them) and a <title> (the tooltip).

// Chart geometry, in viewBox units.
const (
	chartW, chartH             = 560.0, 210.0
	plotL, plotR, plotT, plotB = 52.0, 548.0, 12.0, 170.0
	maxXLabels                 = 10
)

// chart is one drawn chart.
type chart struct {
	ID, Title string
	W, H      float64
	PlotL     float64
	PlotR     float64
	PlotB     float64
	YTicks    []tick
	XTicks    []tick
	Bars      []bar
	Points    []point
	Line      string // the means' polyline
	Legend    []legend
	Empty     bool // no value to draw
}

type tick struct {
	Pos   float64
	Label string
}

// bar is one segment of a (stacked) bar.
type bar struct {
	X, Y, W, H          float64
	Class, Series, Step string
	Value, Title        string
}

// point is a mean with its spread: Lo..Hi is mean ± standard deviation,
// Min..Max the extremes.
type point struct {
	X, Y, Lo, Hi, Min, Max float64
	Step, Mean, Std, Title string
}

type legend struct{ Class, Name string }

// series is one stacked part of a bar chart.
type series struct {
	Name, Class string
	Values      []float64
}

// newChart lays out the x axis of n steps named labels.
func newChart(id, title string, labels []string) chart {
	c := chart{ID: id, Title: title, W: chartW, H: chartH, PlotL: plotL, PlotR: plotR, PlotB: plotB, Empty: true}
	every := (len(labels) + maxXLabels - 1) / maxXLabels
	for i, l := range labels {
		if every > 0 && i%every == 0 {
			c.XTicks = append(c.XTicks, tick{xCenter(i, len(labels)), shortLabel(l)})
		}
	}
	return c
}

// xCenter is the middle of slot i of n.
func xCenter(i, n int) float64 {
	return round1(plotL + (float64(i)+0.5)*(plotR-plotL)/float64(n))
}

// y maps v in [lo, hi] to the plot's height.
func yOf(v, lo, hi float64) float64 {
	if hi <= lo {
		return plotB
	}
	return round1(plotB - (v-lo)/(hi-lo)*(plotB-plotT))
}

// round1 keeps one decimal of a coordinate.
func round1(f float64) float64 { return math.Round(f*10) / 10 }

// niceRange widens [lo, hi] to multiples of a round step (1, 2, 2.5 or 5
// times a power of ten) that cuts it in about four.
func niceRange(lo, hi float64) (float64, float64, float64) {
	raw := (hi - lo) / 4
	if raw <= 0 {
		return lo, hi, 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, m := range []float64{1, 2, 2.5, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	return math.Floor(lo/step+1e-9) * step, math.Ceil(hi/step-1e-9) * step, step
}

// yTicks labels the multiples of step from lo to hi.
func yTicks(lo, hi, step float64, unit string) []tick {
	var out []tick
	for v := lo; v <= hi+step/2; v += step {
		out = append(out, tick{yOf(v, lo, hi), fmtTick(round4(v)) + unit})
	}
	return out
}

// barChart draws stacked bars, one per step, of each series' values.
func barChart(id, title string, labels []string, ss []series, unit string, fixedMax float64) chart {
	c := newChart(id, title, labels)
	hi := fixedMax
	for i := range labels {
		total := 0.0
		for _, s := range ss {
			total += s.Values[i]
		}
		hi = math.Max(hi, total)
		if total > 0 {
			c.Empty = false
		}
	}
	if hi <= 0 {
		hi = 1
	}
	_, hi, step := niceRange(0, hi)
	c.YTicks = yTicks(0, hi, step, unit)
	slot := (plotR - plotL) / float64(max(len(labels), 1))
	w := math.Max(slot*0.7, 1)
	for i, l := range labels {
		base := 0.0
		for _, s := range ss {
			v := s.Values[i]
			if v <= 0 {
				continue
			}
			top, bottom := yOf(base+v, 0, hi), yOf(base, 0, hi)
			c.Bars = append(c.Bars, bar{X: round1(xCenter(i, len(labels)) - w/2), Y: top, W: round1(w), H: round1(bottom - top),
				Class: s.Class, Series: s.Name, Step: l, Value: fmtTick(v),
				Title: l + ": " + s.Name + " " + fmtTick(v) + unit})
			base += v
		}
	}
	for _, s := range ss {
		c.Legend = append(c.Legend, legend{s.Class, s.Name})
	}
	return c
}

// rewardChart draws each step's mean reward with its standard deviation
// (a bar) and extremes (whiskers), joined by a line; steps without a
// reward have no point.
func rewardChart(id, title string, labels []string, mean, std, lo, hi []float64) chart {
	c := newChart(id, title, labels)
	yLo, yHi := math.Inf(1), math.Inf(-1)
	for i := range labels {
		if math.IsNaN(mean[i]) {
			continue
		}
		yLo = math.Min(yLo, math.Min(lo[i], mean[i]-std[i]))
		yHi = math.Max(yHi, math.Max(hi[i], mean[i]+std[i]))
	}
	if math.IsInf(yLo, 1) {
		c.YTicks = yTicks(0, 1, 0.25, "")
		return c
	}
	c.Empty = false
	if yHi-yLo < 1e-9 {
		yLo, yHi = yLo-0.5, yHi+0.5
	}
	yLo, yHi, step := niceRange(yLo, yHi)
	c.YTicks = yTicks(yLo, yHi, step, "")
	var line []string
	for i, l := range labels {
		if math.IsNaN(mean[i]) {
			continue
		}
		x := xCenter(i, len(labels))
		p := point{X: x, Y: yOf(mean[i], yLo, yHi), Lo: yOf(mean[i]-std[i], yLo, yHi), Hi: yOf(mean[i]+std[i], yLo, yHi),
			Min: yOf(lo[i], yLo, yHi), Max: yOf(hi[i], yLo, yHi), Step: l, Mean: fmtFloat(round4(mean[i])), Std: fmtFloat(round4(std[i]))}
		p.Title = l + ": mean " + p.Mean + " ± " + p.Std + " (min " + fmtTick(lo[i]) + ", max " + fmtTick(hi[i]) + ")"
		c.Points = append(c.Points, p)
		line = append(line, strconv.FormatFloat(x, 'f', 1, 64)+","+strconv.FormatFloat(p.Y, 'f', 1, 64))
	}
	c.Line = strings.Join(line, " ")
	c.Legend = []legend{{"mean", "mean"}, {"spread", "± standard deviation"}, {"whisker", "min–max"}}
	return c
}

func round4(f float64) float64 { return math.Round(f*1e4) / 1e4 }

// fmtTick renders an axis or bar value: integers as such, else 3
// significant digits.
func fmtTick(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// shortLabel shortens an x label to 14 characters.
func shortLabel(s string) string {
	r := []rune(s)
	if len(r) <= 14 {
		return s
	}
	return string(r[:6]) + "…" + string(r[len(r)-7:])
}
