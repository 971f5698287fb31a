package ui

import (
	"bytes"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// Unattributed is how the viewer names, in its pages and paths, the calls
// captured without a rollout (rollout_id ”; no /rollout/{r}/attempt/{a}
// path and no x-rollout-id header): its parentheses are outside the rollout
// id charset, so no rollout can have this id.
const Unattributed = "(unattributed)"

// rolloutSegment escapes a rollout id as a path segment; the empty id of
// unattributed calls is Unattributed.
func rolloutSegment(id string) string {
	if id == "" {
		return Unattributed
	}
	return url.PathEscape(id)
}

// rolloutName is a rollout id as a page shows it: Unattributed for the
// empty id.
func rolloutName(id string) string {
	if id == "" {
		return Unattributed
	}
	return id
}

// parsePages parses each page template of assets/ with the shared layout.
func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"seg":     rolloutSegment,
		"rid":     rolloutName,
		"query":   url.QueryEscape,
		"nanos":   fmtNanos,
		"dur":     fmtDur,
		"num":     fmtFloat,
		"short":   shortFloat,
		"shade":   shade,
		"inc":     func(i int) int { return i + 1 },
		"percent": func(a, b int) int { return percent(a, b) },
	}
	names, err := fs.Glob(assets, "assets/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "assets/"), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "assets/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("ui: template %s: %w", n, err)
		}
		pages[base] = t
	}
	return pages, nil
}

// page is what every page template gets.
type page struct {
	Title string
	Nav   string // which top link is current
	Data  any
}

// render writes page name with data, or a 500 naming the template error.
func (s *Server) render(ctx *fasthttp.RequestCtx, status int, name, title string, data any) {
	s.renderTemplate(ctx, status, name, "layout.html", page{Title: title, Data: data})
}

// renderTemplate executes template tmpl of page name into the response.
func (s *Server) renderTemplate(ctx *fasthttp.RequestCtx, status int, name, tmpl string, data any) {
	t := s.pages[name]
	var buf bytes.Buffer
	if t == nil {
		status, buf = fasthttp.StatusInternalServerError, *bytes.NewBufferString("ui: no page " + name)
	} else if err := t.ExecuteTemplate(&buf, tmpl, data); err != nil {
		s.log.Error("ui: rendering failed", "page", name, "err", err)
		ctx.Response.Reset()
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString("ui: rendering " + name + " failed; the gateway's log has the error")
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("text/html; charset=utf-8")
	ctx.SetBody(buf.Bytes())
}

// fail answers a page that says what went wrong (not found, bad input).
func (s *Server) fail(ctx *fasthttp.RequestCtx, status int, msg string) {
	title := fasthttp.StatusMessage(status)
	s.render(ctx, status, "error", title, struct {
		Status  int
		Message string
	}{status, msg})
}

// fmtNanos renders a unix time in nanoseconds as UTC, or "—".
func fmtNanos(n uint64) string {
	if n == 0 {
		return "—"
	}
	return time.Unix(0, int64(n)).UTC().Format("2006-01-02 15:04:05.000")
}

// fmtDur renders nanoseconds as a duration rounded for reading.
func fmtDur(n uint64) string {
	if n == 0 {
		return "—"
	}
	d := time.Duration(n)
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(100 * time.Microsecond).String()
	default:
		return d.Round(time.Millisecond).String()
	}
}

// fmtFloat renders a score with up to 4 decimals.
func fmtFloat(f float64) string {
	if math.IsNaN(f) {
		return "NaN"
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// shade maps a logprob to one of eight CSS classes, lp0 (p ≥ 0.9) to lp7
// (p < 0.01), so that unlikely tokens stand out.
func shade(lp float32) string {
	p := math.Exp(float64(lp))
	bounds := [...]float64{0.9, 0.7, 0.5, 0.3, 0.1, 0.05, 0.01}
	for i, b := range bounds {
		if p >= b {
			return "lp" + strconv.Itoa(i)
		}
	}
	return "lp7"
}

func percent(a, b int) int {
	if b == 0 {
		return 0
	}
	return a * 100 / b
}

// shortFloat renders a number given as text with 4 decimals (the page
// keeps the full value in a data-value attribute).
func shortFloat(s string) string {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return s
	}
	return strconv.FormatFloat(f, 'f', 4, 64)
}
