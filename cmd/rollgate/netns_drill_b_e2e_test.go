//go:build linux

package main

import (
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/rollgate/rollgate/testkit/netns"
)

// drillBDelay is drill b's added latency each way (200 ms round trip), and
// drillBLoss its packet loss in percent.
const (
	drillBDelay = 100 * time.Millisecond
	drillBLoss  = 5
)

// TestDrillLatencyAndLossToPostgres (drill b): three gateways reach their
// shared PostgreSQL through a relay host; for 12 s (full form: a minute)
// the relay adds 100 ms each way (200 ms per round trip; per chunk, see
// netns.Relay) and the links between the gateways and the relay drop 5 % of
// the packets, while agents keep calling: six pinned two to a gateway, two
// moving to the next gateway every turn (each of their calls a takeover).
// Every answered call is stored once, no id repeats or goes down within a
// rollout, no gateway gives up its listening session (its lease, 4 s,
// holds through 200 ms and 5 % loss) and none refuses a call for its
// sequence store; calls per second before and during the fault are logged.
//
// The relay's latency is per chunk (netns.Relay): a packet lost on a
// gateway's link is resent after the kernel's minimum RTO (200 ms), sooner
// than on a real 200 ms link (about 400 ms, doubling), so this drill is
// milder on resends than the network it stands for. The heartbeat's bound
// (seqstore: a round trip may take until half the lease after the last
// answer) is sized for the real one; with the relay at 900 ms per round
// trip and 5 % loss, the old bound (a quarter of the lease per round trip)
// lost sessions here and the new one did not.
func TestDrillLatencyAndLossToPostgres(t *testing.T) {
	base, fault := 4*time.Second, 12*time.Second
	if drillsFull() {
		base, fault = 10*time.Second, time.Minute
	}
	var relay *netns.Relay
	var relayHost *netns.Host
	c := newClusterWith(t, 3, 1, clusterOptions{gatewayDSN: func(c *cluster) string {
		relayHost = c.n.Host("pgrelay")
		relay = c.n.Relay(relayHost, 5432, c.pg.Addr(5432), 0)
		u, err := url.Parse(c.pgDSN)
		if err != nil {
			t.Fatal(err)
		}
		u.Host = relay.Addr
		return u.String()
	}})
	moving := func(rollout string) bool { return rollout == "dr-6" || rollout == "dr-7" } // agents 6 and 7 move every turn
	load := c.runAgents(8, func(a, turn int) int {
		if a < 6 {
			return a % 3
		}
		return (a + turn) % 3
	})
	waitUntil(t, "every agent answered a few times", 20*time.Second, func() bool { return answeredSince(load, time.Time{}, -1) >= 40 })
	counters := func() (refused, lost, waits, timeouts []float64) {
		for _, g := range c.gws {
			refused = append(refused, metricSum(t, g.addr, `rollgate_calls_rejected_total{reason="sequence_store"}`))
			lost = append(lost, metricSum(t, g.addr, `rollgate_sequence_session_lost_total`))
			waits = append(waits, metricSum(t, g.addr, `rollgate_sequence_waits_total`))
			timeouts = append(timeouts, metricSum(t, g.addr, `rollgate_sequence_takeovers_total{outcome="timeout"}`))
		}
		return refused, lost, waits, timeouts
	}
	baseAt := time.Now()
	time.Sleep(base) // the window calls/s are measured in before the fault: the drill's scenario, not a wait for a condition
	refusedBefore, lostBefore, waitsBefore, timeoutsBefore := counters()

	faultAt := time.Now()
	relay.SetDelay(drillBDelay)
	for _, g := range c.gws {
		c.n.Loss(g.h, relayHost, drillBLoss)
	}
	time.Sleep(fault) // the fault's length: the drill's scenario, not a wait for a condition
	healAt := time.Now()
	relay.SetDelay(0)
	for _, g := range c.gws {
		c.n.Heal(g.h, relayHost)
	}
	refusedAfter, lostAfter, waitsAfter, timeoutsAfter := counters()
	waitUntil(t, "every gateway answers after the heal", 20*time.Second, func() bool {
		for i := range c.gws {
			if answeredSince(load, healAt, i) == 0 {
				return false
			}
		}
		return true
	})
	calls := load.halt()

	rep := c.account(fmt.Sprintf("b. %s + %d %% loss gateways–PostgreSQL %s", 2*drillBDelay, drillBLoss, fault), calls)
	// window sums up the calls answered that started in [from, to): calls/s
	// of all, and the count and median duration of the pinned and the
	// moving agents' calls (each of the latter a takeover).
	window := func(from, to time.Time) string {
		var pinned, moved []time.Duration
		for _, call := range calls {
			if call.status == 200 && !call.start.Before(from) && call.start.Before(to) {
				if moving(call.rollout) {
					moved = append(moved, call.end.Sub(call.start))
				} else {
					pinned = append(pinned, call.end.Sub(call.start))
				}
			}
		}
		quantiles := func(d []time.Duration) string {
			if len(d) == 0 {
				return "-"
			}
			slices.Sort(d)
			return fmt.Sprintf("median %s, p99 %s", d[len(d)/2].Round(time.Millisecond), d[len(d)*99/100].Round(time.Millisecond))
		}
		return fmt.Sprintf("%.1f calls/s in %s; pinned agents %d calls (%s), moving agents %d calls (%s)",
			float64(len(pinned)+len(moved))/to.Sub(from).Seconds(), to.Sub(from).Round(time.Millisecond),
			len(pinned), quantiles(pinned), len(moved), quantiles(moved))
	}
	t.Logf("drill table row:\n%s", rep)
	t.Logf("answered before the fault: %s", window(baseAt, faultAt))
	t.Logf("answered during the fault: %s", window(faultAt, healAt))
	var refused, lost float64
	for i := range c.gws {
		refused += refusedAfter[i] - refusedBefore[i]
		lost += lostAfter[i] - lostBefore[i]
		t.Logf("gw%d during the fault: %v sequence_store refusals, listening session lost %v times, %v calls waited for a reservation, %v takeovers not acknowledged in time",
			i, refusedAfter[i]-refusedBefore[i], lostAfter[i]-lostBefore[i], waitsAfter[i]-waitsBefore[i], timeoutsAfter[i]-timeoutsBefore[i])
	}

	if rep.Repeated != 0 || rep.Missing != 0 || rep.Duplicated != 0 || rep.Order != 0 {
		t.Errorf("repeated %d, missing %d, duplicated %d, out of order %d: want all 0", rep.Repeated, rep.Missing, rep.Duplicated, rep.Order)
	}
	if lost != 0 {
		t.Errorf("the gateways lost their listening session %v times during %s of %s + %d %% loss, want 0 (--sequence-lease %s)", lost, fault, 2*drillBDelay, drillBLoss, drillLease)
	}
	if refused != 0 || rep.Refused != 0 || rep.Failed != 0 {
		t.Errorf("%v calls refused for the sequence store (gateways' count), %d answered 503, %d failed otherwise: want 0", refused, rep.Refused, rep.Failed)
	}
	for i := range c.gws {
		if answeredSince(load, faultAt, i)-answeredSince(load, healAt, i) == 0 {
			t.Errorf("gw%d answered no call started during the fault", i)
		}
	}
	moved := 0
	for _, call := range calls {
		if call.status == 200 && moving(call.rollout) && call.start.After(faultAt) && call.start.Before(healAt) {
			moved++
		}
	}
	if moved == 0 {
		t.Errorf("the moving agents answered no call during the fault: no takeover was exercised")
	}
}
