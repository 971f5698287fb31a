package main

// Agent Lightning's event reads against the real gateway process (issue 36
// item 6): GET /api/rollouts/{id}/events streams the events one at a time
// and pages them, GET /api/rollouts/{id} reads none of their data, so the
// gateway's memory does not grow with the size of a rollout's events.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/controlplane/tasks"
)

// TestAGLEventReadsAreBounded: a rollout with 20 posted events of 2 MB
// (40 MB; the drill had five of 25 MB) and one model call. 4
// concurrent reads of all its events (AGL's trainer, no paging), then 16
// concurrent GET /api/rollouts/{id} (the trainer's poll), keep the
// gateway's peak RSS within 64 MiB of what it was; every read has every
// event once, in order, and so do the pages of ?limit=3 followed through
// X-Rollgate-Next-After and the pages the byte bound ends early.
func TestAGLEventReadsAreBounded(t *testing.T) {
	const events, size, conc = 20, 2_000_000, 4
	mockURL := startMock(t)
	addr, dir := freeAddr(t), t.TempDir()
	db := filepath.Join(dir, "rollgate.db")
	args := []string{"serve", "--listen", addr, "--db", db, "--upstream", mockURL, "--agl", "--agl-model-name", "policy"}
	cmd, logs := start(t, addr, "/readyz", args...)
	stop(t, cmd, logs)

	// The events are written while the gateway is down: its peak RSS before
	// the reads is not that of receiving them.
	ctx := context.Background()
	q, err := tasks.Open(ctx, db, tasks.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := q.CreateIfAbsent(ctx, tasks.Task{RolloutID: "ro-ev", Input: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	pad := strings.Repeat("e", size)
	for i := range events {
		err := q.AddEvent(ctx, &tasks.Event{RolloutID: "ro-ev", AttemptID: "0", Type: "blob", Data: json.RawMessage(`{"i":` + strconv.Itoa(i) + `,"pad":"` + pad + `"}`)})
		if err != nil {
			t.Fatal(err)
		}
	}
	q.Close()

	cmd, logs = start(t, addr, "/readyz", args...)
	base := "http://" + addr
	aglDo(t, "POST", base+"/api/models", `[{"model":"policy","endpoint":"`+mockURL+`","version":1}]`, 201)
	aglDo(t, "POST", base+"/proxy/rollout/ro-ev/attempt/0/mode/train/openai/v1/chat/completions",
		`{"model":"auto","max_tokens":3,"messages":[{"role":"user","content":"hello"}]}`, 200)
	check := func(what string, evs []gjson.Result, from int) {
		t.Helper()
		for k, ev := range evs {
			i := from + k
			switch {
			case i < events && (ev.Get("event_type").String() != "blob" || ev.Get("data.i").Int() != int64(i) || len(ev.Get("data.pad").Str) != size):
				t.Fatalf("%s: event %d is not blob %d of %d bytes: %.200s", what, i, i, size, ev.Raw)
			case i == events && ev.Get("event_type").String() != "model_request":
				t.Fatalf("%s: event %d is not the model call: %.200s", what, i, ev.Raw)
			case i > events:
				t.Fatalf("%s: more than %d events", what, events+1)
			}
		}
	}
	// Warm up (pools, the stores' caches) on a page of one event.
	getAll(t, []string{base + "/api/rollouts/ro-ev/events?after=0&limit=1"}, 1, 200)
	before := peakRSS(t, cmd.Process.Pid)

	all := gjson.Parse(getAll(t, []string{base + "/api/rollouts/ro-ev/events"}, conc, 200)[0]).Array()
	if len(all) != events+1 {
		t.Fatalf("GET events: %d events, want %d", len(all), events+1)
	}
	check("GET events", all, 0)
	t.Logf("after events: %.0f MiB", peakRSS(t, cmd.Process.Pid)/(1<<20))
	if r := getAll(t, []string{base + "/api/rollouts/ro-ev"}, 16, 200)[0]; gjson.Get(r, "attempts").Raw != `["0"]` {
		t.Fatalf("GET /api/rollouts/ro-ev: %.300s", r)
	}
	after := peakRSS(t, cmd.Process.Pid)
	t.Logf("GET events ×%d and GET rollout ×16 of %d events of %d bytes: peak RSS %.0f → %.0f MiB", conc, events, size, before/(1<<20), after/(1<<20))
	if grew := after - before; grew > 64<<20 {
		t.Errorf("peak RSS grew by %.0f MiB (%.0f → %.0f MiB) under %d concurrent reads of %d events of %d bytes, bound 64 MiB\n%s",
			grew/(1<<20), before/(1<<20), after/(1<<20), conc, events, size, truncateForLog(logs.String()))
	}

	// Pages: ?limit=3, and pages of ?limit=100 that the byte bound (16 MiB)
	// ends after 9 events of 2 MB.
	for _, c := range []struct {
		limit, most int
	}{{3, 3}, {100, 9}} {
		seen, pages := 0, 0
		for next := "0"; next != ""; pages++ {
			if pages > events {
				t.Fatal("paging does not end")
			}
			r, err := http.Get(base + "/api/rollouts/ro-ev/events?after=" + next + "&limit=" + strconv.Itoa(c.limit))
			if err != nil {
				t.Fatal(err)
			}
			var raw json.RawMessage
			err = json.NewDecoder(r.Body).Decode(&raw)
			r.Body.Close()
			evs := gjson.ParseBytes(raw).Array()
			if err != nil || r.StatusCode != 200 || len(evs) == 0 || len(evs) > c.most {
				t.Fatalf("page after=%s limit=%d: %d, %d events (at most %d), %v", next, c.limit, r.StatusCode, len(evs), c.most, err)
			}
			check(fmt.Sprintf("page after=%s limit=%d", next, c.limit), evs, seen)
			seen += len(evs)
			next = r.Header.Get("X-Rollgate-Next-After")
			if next != "" && next != strconv.Itoa(seen) {
				t.Fatalf("X-Rollgate-Next-After %s after %d events", next, seen)
			}
		}
		if seen != events+1 {
			t.Fatalf("pages of limit=%d: %d events, want %d", c.limit, seen, events+1)
		}
	}
	if code := getCode(t, base+"/api/rollouts/ro-ev/events?limit=0"); code != 422 {
		t.Errorf("limit=0: %d, want 422", code)
	}
}
