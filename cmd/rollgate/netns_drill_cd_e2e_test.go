//go:build linux

package main

import (
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// queryRows runs query on every gateway's --db (read-only; the gateways
// are stopped by then) and hands each row to scan.
func (c *cluster) queryRows(query string, scan func(gw int, rows *sql.Rows) error) {
	c.t.Helper()
	for i, g := range c.gws {
		db, err := sql.Open("sqlite", "file:"+g.db+"?mode=ro")
		if err != nil {
			c.t.Fatal(err)
		}
		rows, err := db.Query(query)
		if err != nil {
			c.t.Fatalf("reading %s: %v", g.db, err)
		}
		for rows.Next() {
			if err := scan(i, rows); err != nil {
				c.t.Fatal(err)
			}
		}
		if err := rows.Err(); err != nil {
			c.t.Fatalf("reading %s: %v", g.db, err)
		}
		rows.Close()
		db.Close()
	}
}

// backendGauge polls, every 50 ms until stop closes, the calls in flight
// on one replica summed over every gateway, and keeps the samples.
type backendGauge struct {
	mu      sync.Mutex
	samples []gaugeSample
	stop    chan struct{}
	done    chan struct{}
}

type gaugeSample struct {
	at time.Time
	n  float64
}

func (c *cluster) watchInFlight(backend string) *backendGauge {
	g := &backendGauge{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(g.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			n := 0.0
			for _, gw := range c.gws {
				n += metricSum(c.t, gw.addr, `rollgate_backend_in_flight_requests{backend="`+backend+`"}`)
			}
			g.mu.Lock()
			g.samples = append(g.samples, gaugeSample{time.Now(), n})
			g.mu.Unlock()
			select {
			case <-g.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return g
}

// last is the latest sample.
func (g *backendGauge) last() float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.samples) == 0 {
		return 0
	}
	return g.samples[len(g.samples)-1].n
}

// halt stops the polling and returns the samples.
func (g *backendGauge) halt() []gaugeSample {
	close(g.stop)
	<-g.done
	return g.samples
}

// TestDrillEnginePartitionedMidStream (drill c): 3 gateways, 4 mock engine
// replicas streaming slowly (8 tokens 250 ms apart: 2 s answers), 12
// streaming multi-turn agents spread over the gateways; engine 0's host is
// cut silently from every gateway for 8 s (full form: 30 s) while streams
// run on it, then healed. The streams cut end with an error event (never a
// short answer that looks complete) within --idle-timeout (3 s here) and are
// captured as error rows; new calls go to the other replicas; every answered
// call is stored once with no id repeated or going down; after the heal
// engine 0 answers calls again.
func TestDrillEnginePartitionedMidStream(t *testing.T) {
	cut := 8 * time.Second
	if drillsFull() {
		cut = 30 * time.Second
	}
	const idle = 3 * time.Second // newCluster's --idle-timeout
	c := newClusterWith(t, 3, 4, clusterOptions{engineArgs: []string{"--itl", "250ms", "--max-tokens", "8"}})
	victim := c.engines[0]
	load := c.runAgents(12, func(a, turn int) int { return a % 3 })
	inflight := c.watchInFlight("e0")
	waitUntil(t, "streams running on engine 0", 20*time.Second, func() bool {
		return answeredSince(load, time.Time{}, -1) >= 12 && inflight.last() >= 2
	})
	servedBefore := 0.0
	for _, g := range c.gws {
		servedBefore += metricSum(t, g.addr, `rollgate_requests_total{backend="e0",`)
	}

	cutAt := time.Now()
	for _, g := range c.gws {
		c.n.Cut(victim, g.h)
	}
	time.Sleep(cut) // the cut's length: the drill's scenario, not a wait for a condition
	healAt := time.Now()
	for _, g := range c.gws {
		c.n.Heal(victim, g.h)
	}
	// Back in rotation: some gateway has a call on engine 0 again.
	waitUntil(t, "engine 0 serving calls again after the heal", 30*time.Second, func() bool { return inflight.last() > 0 })
	back := time.Now()
	waitUntil(t, "a few answered calls after engine 0's return", 10*time.Second, func() bool { return answeredSince(load, back, -1) >= 12 })
	calls := load.halt()
	samples := inflight.halt()
	servedAfter := 0.0
	for _, g := range c.gws {
		servedAfter += metricSum(t, g.addr, `rollgate_requests_total{backend="e0",`)
	}

	rep := c.account(fmt.Sprintf("c. engine host cut mid-stream %s", cut), calls)
	rep.Recover = back.Sub(healAt)
	// Noticed: from the cut on, the time after which no gateway had a call
	// on engine 0 any more until the heal (its cut streams ended, no new
	// call sent to it).
	var lastBusy time.Time
	inFlightAtCut := 0.0
	for _, s := range samples {
		if !s.at.Before(cutAt) && inFlightAtCut == 0 {
			inFlightAtCut = s.n
		}
		if s.at.After(cutAt) && s.at.Before(healAt) && s.n > 0 {
			lastBusy = s.at
		}
	}
	rep.StopAfter = max(0, lastBusy.Sub(cutAt))

	// What the agents saw of the calls in flight across the cut.
	var errEvents, truncated, noResponse, answeredAcross int
	var slowestCut, slowestAnswer time.Duration
	for _, call := range calls {
		if call.status == 200 && call.start.After(cutAt) && call.start.Before(healAt) {
			slowestAnswer = max(slowestAnswer, call.end.Sub(call.start))
		}
		across := call.start.Before(cutAt) && call.end.After(cutAt)
		switch {
		case call.status == 200 && across:
			answeredAcross++
		case call.errEvent:
			errEvents++
			if across {
				slowestCut = max(slowestCut, call.end.Sub(cutAt))
			}
		case call.truncated:
			truncated++
		case call.status == 0:
			noResponse++
		}
	}
	// How the cut calls were captured, and where calls went during the cut.
	var errorRows, duringOnVictim, duringRetried, duringElsewhere int
	var lastOnVictim time.Time
	var victimRows []string
	c.queryRows(`SELECT backend, error, http_status, start_time_unix_nano, backend_attempts FROM llm_calls WHERE rollout_id LIKE 'dr-%'`, func(_ int, rows *sql.Rows) error {
		var backend, errText string
		var status, start, attempts int64
		if err := rows.Scan(&backend, &errText, &status, &start, &attempts); err != nil {
			return err
		}
		if errText != "" {
			errorRows++
		}
		at := time.Unix(0, start)
		if at.After(cutAt) && at.Before(healAt) {
			switch {
			case backend == "e0":
				duringOnVictim++
				victimRows = append(victimRows, fmt.Sprintf("+%s status %d attempts %d %q", at.Sub(cutAt).Round(10*time.Millisecond), status, attempts, errText))
				if at.After(lastOnVictim) {
					lastOnVictim = at
				}
			case attempts > 1:
				duringRetried++
			default:
				duringElsewhere++
			}
		}
		return nil
	})
	t.Logf("drill table row:\n%s", rep)
	t.Logf("rows of calls started on engine 0 during the cut: %s", strings.Join(victimRows, "; "))
	for _, call := range calls {
		if call.status != 200 && !call.errEvent {
			t.Logf("failed call on gw%d %s +%s..+%s: status %d", call.gw, call.rollout, call.start.Sub(cutAt).Round(10*time.Millisecond), call.end.Sub(cutAt).Round(10*time.Millisecond), call.status)
		}
	}
	t.Logf("engine 0: %v calls in flight at the cut; agents saw %d error events (slowest %s after the cut), %d truncated streams without an error event, %d calls without a response, %d calls answered across the cut; %d error rows captured",
		inFlightAtCut, errEvents, slowestCut.Round(10*time.Millisecond), truncated, noResponse, answeredAcross, errorRows)
	t.Logf("during the cut: %d calls started on engine 0 (the last %s after the cut), %d answered by another replica after a failed attempt, %d by another replica at once, the slowest answer took %s (a 2 s stream); engine 0 served %v calls in all (%v before the cut)",
		duringOnVictim, max(0, lastOnVictim.Sub(cutAt)).Round(10*time.Millisecond), duringRetried, duringElsewhere, slowestAnswer.Round(10*time.Millisecond), servedAfter, servedBefore)

	if rep.Repeated != 0 || rep.Missing != 0 || rep.Duplicated != 0 || rep.Order != 0 {
		t.Errorf("repeated %d, missing %d, duplicated %d, out of order %d: want all 0", rep.Repeated, rep.Missing, rep.Duplicated, rep.Order)
	}
	if truncated != 0 || noResponse != 0 {
		t.Errorf("%d streams stopped without [DONE] or an error event and %d calls got no response: a cut must reach the client as an error event", truncated, noResponse)
	}
	if inFlightAtCut == 0 || errEvents == 0 {
		t.Errorf("%v calls in flight on engine 0 at the cut, %d error events: the drill cut no stream", inFlightAtCut, errEvents)
	}
	if errorRows < errEvents {
		t.Errorf("%d error rows captured for %d error events the agents saw: want one row per cut call", errorRows, errEvents)
	}
	if bound := idle + time.Second; slowestCut > bound {
		t.Errorf("a stream cut ended %s after the cut, want within --idle-timeout + 1s (%s)", slowestCut, bound)
	}
	if duringElsewhere+duringRetried == 0 {
		t.Errorf("no call was answered by another replica during the cut")
	}
	if servedAfter <= servedBefore {
		t.Errorf("engine 0 served %v calls before the cut and %v at the end: it did not come back into rotation", servedBefore, servedAfter)
	}
	if rep.Failed != errEvents {
		t.Errorf("%d calls failed, %d of them with an error event: want every failure to be a cut stream's error event", rep.Failed, errEvents)
	}
}

var _ = syscall.SIGKILL
