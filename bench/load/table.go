package load

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
)

// Table writes a markdown table comparing reports against baseline's: for
// each scenario and label, the median over the label's runs (rounds) of
// throughput, latency and TTFT percentiles, CPU per 1,000 calls and peak RSS,
// and the differences and ratios against the baseline label's medians.
func Table(w io.Writer, reports []*Report, baseline string) {
	type key struct{ scenario, label string }
	var order []key
	groups := map[key][]*Report{}
	for _, r := range reports {
		k := key{r.Scenario, r.Label}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	med := func(rs []*Report, f func(*Report) float64) float64 {
		v := make([]float64, 0, len(rs))
		for _, r := range rs {
			v = append(v, f(r))
		}
		slices.Sort(v)
		if len(v) == 0 {
			return 0
		}
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	fmt.Fprintln(w, "| scenario | target | runs | calls/s | × direct | p50 | +p50 | p99 | +p99 | TTFT p50 | +TTFT p50 | CPU s / 1k calls | peak RSS MiB | errors | capture missing / dup / bad |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, k := range order {
		rs := groups[k]
		base := groups[key{k.scenario, baseline}]
		thr := med(rs, func(r *Report) float64 { return r.Throughput })
		p50 := med(rs, func(r *Report) float64 { return r.Latency.P50 })
		p99 := med(rs, func(r *Report) float64 { return r.Latency.P99 })
		ttft := med(rs, func(r *Report) float64 { return r.TTFT.P50 })
		ratio, dp50, dp99, dttft := "", "", "", ""
		if len(base) > 0 {
			if bt := med(base, func(r *Report) float64 { return r.Throughput }); bt > 0 {
				ratio = fmt.Sprintf("%.2f", thr/bt)
			}
			dp50 = signedUS(p50 - med(base, func(r *Report) float64 { return r.Latency.P50 }))
			dp99 = signedUS(p99 - med(base, func(r *Report) float64 { return r.Latency.P99 }))
			if ttft > 0 {
				dttft = signedUS(ttft - med(base, func(r *Report) float64 { return r.TTFT.P50 }))
			}
		}
		ttftS := "–"
		if ttft > 0 {
			ttftS = fmtUS(ttft)
		} else {
			dttft = "–"
		}
		cpu, rss := "–", "–"
		if rs[0].Proc != nil {
			cpu = fmt.Sprintf("%.3f", med(rs, func(r *Report) float64 { return r.Proc.CPUPer1000 }))
			rss = fmt.Sprintf("%.0f", slices.MaxFunc(rs, func(a, b *Report) int {
				return cmpF(a.Proc.PeakRSSMiB, b.Proc.PeakRSSMiB)
			}).Proc.PeakRSSMiB)
		}
		errs := 0
		for _, r := range rs {
			errs += r.Errors
		}
		capt := "–"
		if rs[0].Capture != nil {
			var m, d, b int
			for _, r := range rs {
				m += r.Capture.Missing
				d += r.Capture.Duplicate
				b += r.Capture.BadTokens + r.Capture.Mismatch
			}
			capt = fmt.Sprintf("%d / %d / %d", m, d, b)
		}
		fmt.Fprintf(w, "| %s | %s | %d | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |\n",
			k.scenario, k.label, len(rs), thr, ratio, fmtUS(p50), dp50, fmtUS(p99), dp99, ttftS, dttft, cpu, rss, errs, capt)
	}
}

func signedUS(us float64) string {
	if us < 0 {
		return "−" + fmtUS(-us)
	}
	return "+" + fmtUS(us)
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ReadReports reads reports written one JSON object per line (rollgate bench
// --json FILE appends one per run). Blank lines are skipped.
func ReadReports(r io.Reader) ([]*Report, error) {
	dec := json.NewDecoder(r)
	var out []*Report
	for {
		rep := new(Report)
		err := dec.Decode(rep)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("load: reading report %d: %w", len(out)+1, err)
		}
		out = append(out, rep)
	}
}
