package ui

import (
	"html"
	"math"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
)

// section returns the part of body from the element with id to the end of
// its section.
func section(t *testing.T, body, id string) string {
	t.Helper()
	i := strings.Index(body, `id="`+id+`"`)
	if i < 0 {
		t.Fatalf("no element %s", id)
	}
	j := strings.Index(body[i:], "</section>")
	if j < 0 {
		j = len(body) - i
	}
	return body[i : i+j]
}

// figure returns the chart with id.
func figure(t *testing.T, body, id string) string {
	t.Helper()
	i := strings.Index(body, `id="chart-`+id+`"`)
	if i < 0 {
		t.Fatalf("no chart %s", id)
	}
	return body[i : i+strings.Index(body[i:], "</figure>")]
}

// attrs lists attribute name's values over the elements matching tag.
func attrs(s, tag, name string) []string {
	var out []string
	re := regexp.MustCompile(`<` + tag + `\b[^>]*\b` + name + `="([^"]*)"`)
	for _, m := range re.FindAllStringSubmatch(s, -1) {
		out = append(out, html.UnescapeString(m[1]))
	}
	return out
}

func TestTrainingPage(t *testing.T) {
	stores(t, func(t *testing.T, s export.Store) {
		base := serve(t, s, Config{})
		code, body := get(t, base+"/ui/training")
		if code != 200 {
			t.Fatalf("GET /ui/training: %d %.300s", code, body)
		}
		// By policy version, oldest first: 3 (ro-a, ro-b, ro-c, ro-long), 4 (the odd rollout).
		pol := section(t, body, "axis-policy")
		if got := attrs(pol, "tr", "data-step"); strings.Join(got, "|") != "3|4" {
			t.Fatalf("policy steps %q, want 3|4", got)
		}
		// One reward point (version 4 has no reward): the mean and spread of 1, 0, 0.25.
		rw := figure(t, body, "policy-reward")
		mean := 1.25 / 3
		std := math.Sqrt((1+0+0.0625)/3 - mean*mean)
		if got := attrs(rw, "g", "data-mean"); len(got) != 1 || got[0] != fmtFloat(round4(mean)) {
			t.Errorf("reward points %q, want one at %v", got, round4(mean))
		}
		if got := attrs(rw, "g", "data-std"); len(got) != 1 || got[0] != fmtFloat(round4(std)) {
			t.Errorf("reward spread %q, want %v", got, round4(std))
		}
		if got := attrs(figure(t, body, "policy-calls"), "rect", "data-value"); strings.Join(got, "|") != "7|1" {
			t.Errorf("calls bars %q, want 7|1", got)
		}
		if got := attrs(figure(t, body, "policy-verified"), "rect", "data-value"); strings.Join(got, "|") != "100" {
			t.Errorf("verified bars %q, want one of 100 (version 4's call has no ids: no bar)", got)
		}
		// By group in time order: g1, then the two rollouts without a group, by task.
		grp := section(t, body, "axis-group")
		if got := attrs(grp, "tr", "data-step"); strings.Join(got, "|") != `g1|task t'x\|task task2` {
			t.Fatalf("group steps %q", got)
		}
		if !strings.Contains(grp, `href="/ui/groups/g1"`) {
			t.Errorf("no link to g1's group page")
		}
		ex := figure(t, body, "group-excluded-calls")
		if got := attrs(ex, "rect", "data-series"); strings.Join(got, "|") != "errored|unverified_ids" {
			t.Errorf("excluded calls series %q, want g1's errored call and the odd rollout's unverified one", got)
		}
		if got := attrs(figure(t, body, "group-excluded-attempts"), "rect", "data-step"); strings.Join(got, "|") != `task t'x\|task task2` {
			t.Errorf("unfinished attempts at %q, want the two unregistered rollouts", got)
		}
		// Bridge commands: the store, the window, the task quoted for a shell.
		cmds := attrs(grp, "button", "data-copy")
		if len(cmds) != 3 {
			t.Fatalf("group commands %q", cmds)
		}
		wantStore := "--db "
		if s.Name() == "clickhouse" {
			wantStore = `--clickhouse "$ROLLGATE_CLICKHOUSE"`
		}
		for _, c := range cmds {
			if !strings.HasPrefix(c, "rollgate bridge "+wantStore) || !strings.Contains(c, " --since ") || !strings.HasSuffix(c, " --out batch.parquet") {
				t.Errorf("command %q", c)
			}
		}
		if !strings.Contains(cmds[1], `--tasks 't'\''x\' --group-by task+policy`) {
			t.Errorf("the odd task is not quoted for a shell: %q", cmds[1])
		}
		if !strings.Contains(body, `id="nav-training" href="/ui/training"`) {
			t.Errorf("no link to the training view in the navigation")
		}

		// The search box: an exact id, its group and command.
		_, body = get(t, base+"/ui/training?rollout=ro-b")
		sr := section(t, body, "search-result")
		if !strings.Contains(sr, `data-found="true"`) || !strings.Contains(sr, `href="/ui/groups/g1"`) || !strings.Contains(sr, `href="/ui/rollouts/ro-b"`) {
			t.Errorf("search ro-b: %s", sr)
		}
		if got := attrs(sr, "button", "data-copy"); len(got) != 1 || !strings.Contains(got[0], "--rollouts ro-b ") {
			t.Errorf("search ro-b command %q", got)
		}
		_, body = get(t, base+"/ui/training?rollout="+url.QueryEscape(`ro'q\x`))
		if got := attrs(section(t, body, "search-result"), "button", "data-copy"); len(got) != 1 || !strings.Contains(got[0], `--rollouts 'ro'\''q\x'`) {
			t.Errorf("search of an unregistered rollout with quotes: %q", got)
		}
		code, body = get(t, base+"/ui/training?rollout="+url.QueryEscape(hostile))
		if code != 200 || !strings.Contains(body, `id="search-none"`) || strings.Contains(body, "<script>alert") || strings.Contains(body, "<img src=x") {
			t.Errorf("hostile search: %d, not escaped or not 'none': %.300s", code, section(t, body, "search-result"))
		}

		// Fewer steps, a window, bad options.
		_, body = get(t, base+"/ui/training?steps=1")
		if got := attrs(section(t, body, "axis-group"), "tr", "data-step"); strings.Join(got, "|") != "task task2" || !strings.Contains(body, "Only the latest 1") {
			t.Errorf("steps=1: %q", got)
		}
		_, body = get(t, base+"/ui/training?until=2027-01-01T00:00")
		if !strings.Contains(body, `id="no-steps-group"`) {
			t.Errorf("a window before every call shows steps")
		}
		for _, q := range []string{"steps=0", "steps=501", "steps=x", "since=yesterday", "since=2030-01-01&until=2029-01-01", "rollout=" + strings.Repeat("x", 600), "rollout=%00"} {
			code, body := get(t, base+"/ui/training?"+q)
			if code != 400 || !strings.Contains(body, "Bad training view option") {
				t.Errorf("?%s: %d, want 400 naming the option: %.200s", q, code, body)
			}
		}
	})
}

// TestGroupPageCommand: the group page's bridge command names its rollouts
// and the page's options.
func TestGroupPageCommand(t *testing.T) {
	base := serve(t, sqliteFixture(t), Config{})
	_, body := get(t, base+"/ui/groups/g1?estimator=rloo&air=off")
	got := attrs(body, "button", "data-copy")
	if len(got) != 1 || !strings.Contains(got[0], "--rollouts ro-a,ro-b,ro-c --estimator rloo --mode transitions --air=false --out batch.parquet") {
		t.Errorf("group command %q", got)
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{"ro-1": "ro-1", "a b": "'a b'", `it's`: `'it'\''s'`, "": "''", "$(x)": "'$(x)'"} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNiceRange(t *testing.T) {
	for _, c := range []struct{ lo, hi, wlo, whi, wstep float64 }{
		{-0.202, 1.2, -0.5, 1.5, 0.5}, {0, 66, 0, 80, 20}, {0, 100, 0, 100, 25}, {0, 4, 0, 4, 1}, {0, 1, 0, 1, 0.25}, {0, 7, 0, 8, 2},
	} {
		lo, hi, step := niceRange(c.lo, c.hi)
		if math.Abs(lo-c.wlo) > 1e-9 || math.Abs(hi-c.whi) > 1e-9 || math.Abs(step-c.wstep) > 1e-9 {
			t.Errorf("niceRange(%v, %v) = %v, %v, %v; want %v, %v, %v", c.lo, c.hi, lo, hi, step, c.wlo, c.whi, c.wstep)
		}
	}
}
