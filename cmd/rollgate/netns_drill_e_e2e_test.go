//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/testkit/chcluster"
	"github.com/rollgate/rollgate/testkit/netns"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// chDrill is drill e's ClickHouse cluster: 2 shards × 2 replicas and
// ZooKeeper, each server on a host of its own.
type chDrill struct {
	cl    *chcluster.Cluster
	hosts map[*chcluster.Node]*netns.Host // node → its host
}

// startCHCluster starts ZooKeeper and a 2 × 2 ClickHouse cluster on hosts
// of c's network and applies deploy/clickhouse/cluster.sql (database
// rollgate) once every server is connected to ZooKeeper.
func startCHCluster(c *cluster) *chDrill {
	t := c.t
	t.Helper()
	zk := c.n.Host("zk")
	zkAddr := chcluster.StartZooKeeper(t, chcluster.Placement{Listen: zk.IP.String(), Command: zk.Command})
	d := &chDrill{hosts: map[*chcluster.Node]*netns.Host{}}
	hosts := map[[2]int]*netns.Host{}
	d.cl = chcluster.Start(t, chcluster.Options{Name: "rollgate_drill", ZooKeeper: zkAddr, Shards: 2, Replicas: 2,
		Place: func(s, r int) chcluster.Placement {
			h := c.n.Host(fmt.Sprintf("ch%d%d", s+1, r+1))
			hosts[[2]int{s, r}] = h
			return chcluster.Placement{Listen: h.IP.String(), Command: h.Command}
		}})
	for s, shard := range d.cl.Shards {
		for r, n := range shard {
			d.hosts[n] = hosts[[2]int{s, r}]
		}
	}
	for _, n := range d.cl.Nodes() {
		testenv.WaitFor(t, 30*time.Second, func() string { return n.Name + " connected to ZooKeeper" }, func() bool {
			var k uint64
			return n.Connect(t).QueryRow(context.Background(), "SELECT count() FROM system.zookeeper WHERE path = '/'").Scan(&k) == nil
		})
	}
	script, err := os.ReadFile(filepath.Join("..", "..", "deploy", "clickhouse", "cluster.sql"))
	if err != nil {
		t.Fatal(err)
	}
	d.cl.Shards[0][0].Exec(t, chcluster.Statements(string(script), "rollgate"))
	return d
}

// dsn is gateway i's --clickhouse: every server of the cluster, as a
// client of a Service over them sees them, starting at a different one
// per gateway (gateway 0 at shard 1's first replica, gateway 1 at shard
// 2's).
func (d *chDrill) dsn(i int) string {
	nodes := d.cl.Nodes()
	var addrs []string
	for k := range nodes {
		addrs = append(addrs, nodes[(k+2*i)%len(nodes)].Addr())
	}
	return "clickhouse://" + strings.Join(addrs, ",") + "/rollgate"
}

// storeState is the store part of a gateway's /readyz body.
type storeState struct {
	Store        string `json:"store"`
	SpoolRecords int    `json:"spool_records"`
	WALPending   int    `json:"wal_pending"`
}

// drained tells whether every gateway's store is up with nothing spooled
// and no answered call waiting for its rows to be stored.
func (c *cluster) drained() bool {
	for _, g := range c.gws {
		r, err := http.Get("http://" + g.addr + "/readyz")
		if err != nil {
			return false
		}
		var s storeState
		err = json.NewDecoder(r.Body).Decode(&s)
		r.Body.Close()
		if err != nil || s.Store != "up" || s.SpoolRecords != 0 || s.WALPending != 0 {
			return false
		}
	}
	return true
}

// readyz is every gateway's /readyz body (for a failed wait).
func (c *cluster) readyz() string {
	var b strings.Builder
	for _, g := range c.gws {
		r, err := http.Get("http://" + g.addr + "/readyz")
		if err != nil {
			fmt.Fprintf(&b, "\n%s: %v", g.h.Name, err)
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(r.Body, 4096))
		r.Body.Close()
		fmt.Fprintf(&b, "\n%s: %s", g.h.Name, body)
	}
	return b.String()
}

// spooled is how many batches the gateways' spools hold (/readyz).
func (c *cluster) spooled() int {
	n := 0
	for _, g := range c.gws {
		r, err := http.Get("http://" + g.addr + "/readyz")
		if err != nil {
			c.t.Fatal(err)
		}
		var s storeState
		err = json.NewDecoder(r.Body).Decode(&s)
		r.Body.Close()
		if err != nil {
			c.t.Fatalf("/readyz of %s: %v", g.h.Name, err)
		}
		n += s.SpoolRecords
	}
	return n
}

// inSync tells whether the replicas of every shard hold the same drill
// rows and have nothing left in their replication queues; it returns what
// differs otherwise.
func (d *chDrill) inSync(t *testing.T) string {
	ctx := context.Background()
	for _, shard := range d.cl.Shards {
		var counts []uint64
		for _, n := range shard {
			var rows, queued uint64
			conn := n.Connect(t)
			if err := conn.QueryRow(ctx, "SELECT count() FROM rollgate.llm_calls_local WHERE rollout_id LIKE 'dr-%'").Scan(&rows); err != nil {
				return fmt.Sprintf("%s: %v", n.Name, err)
			}
			if err := conn.QueryRow(ctx, "SELECT count() FROM system.replication_queue WHERE database = 'rollgate'").Scan(&queued); err != nil {
				return fmt.Sprintf("%s: %v", n.Name, err)
			}
			if queued != 0 {
				return fmt.Sprintf("%s has %d entries in its replication queue", n.Name, queued)
			}
			counts = append(counts, rows)
		}
		for i := range counts {
			if counts[i] != counts[0] {
				return fmt.Sprintf("shard %s's replicas hold %v drill rows", shard[0].Shard, counts)
			}
		}
	}
	return ""
}

// state describes every server's replication of llm_calls_local (for a
// failed wait): read-only, leader, queue, active parts, the queue's first
// errors.
func (d *chDrill) state(t *testing.T) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var b strings.Builder
	for _, n := range d.cl.Nodes() {
		var ro, leader uint8
		var queue, merges uint32
		var parts uint64
		conn := n.Connect(t)
		err := conn.QueryRow(ctx, "SELECT is_readonly, is_leader, queue_size, merges_in_queue FROM system.replicas WHERE database = 'rollgate' AND table = 'llm_calls_local'").Scan(&ro, &leader, &queue, &merges)
		if err == nil {
			err = conn.QueryRow(ctx, "SELECT count() FROM system.parts WHERE database = 'rollgate' AND table = 'llm_calls_local' AND active").Scan(&parts)
		}
		fmt.Fprintf(&b, "\n%s: readonly %d, leader %d, queue %d (merges %d), active parts %d, err %v", n.Name, ro, leader, queue, merges, parts, err)
		if ps, err := conn.Query(ctx, "SELECT elapsed, query FROM system.processes WHERE query NOT LIKE '%system.%'"); err == nil {
			for ps.Next() {
				var el float64
				var q string
				if ps.Scan(&el, &q) == nil {
					fmt.Fprintf(&b, "\n    running %.1fs: %.200s", el, q)
				}
			}
			ps.Close()
		}
		rows, err := conn.Query(ctx, "SELECT type, num_tries, last_exception FROM system.replication_queue WHERE database = 'rollgate' AND last_exception != '' LIMIT 3")
		if err != nil {
			continue
		}
		for rows.Next() {
			var typ, exc string
			var tries uint32
			if rows.Scan(&typ, &tries, &exc) == nil {
				fmt.Fprintf(&b, "\n    %s after %d tries: %.300s", typ, tries, exc)
			}
		}
		rows.Close()
	}
	return b.String()
}

// storedRows reads the drill's rows through the Distributed table llm_calls
// (one replica per shard) on node n.
func (d *chDrill) storedRows(t *testing.T, n *chcluster.Node) map[drillKey]int {
	t.Helper()
	rows, err := n.Connect(t).Query(context.Background(), "SELECT rollout_id, sequence_id FROM rollgate.llm_calls WHERE rollout_id LIKE 'dr-%'")
	if err != nil {
		t.Fatalf("reading rollgate.llm_calls on %s: %v", n.Name, err)
	}
	defer rows.Close()
	stored := map[drillKey]int{}
	for rows.Next() {
		var k drillKey
		if err := rows.Scan(&k.rollout, &k.seq); err != nil {
			t.Fatal(err)
		}
		stored[k]++
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("reading rollgate.llm_calls on %s: %v", n.Name, err)
	}
	return stored
}

// TestDrillClickHouseReplicaKilledShardCut (drill e): three gateways
// (sharing PostgreSQL, in front of four mock engines) capture to a
// ClickHouse cluster of 2 shards × 2 replicas with ZooKeeper (each server
// on a host of its own, deploy/clickhouse/cluster.sql, the gateways
// pointed at every server with --spool-dir, as README's "Run at scale"
// says), while six streaming agents call, two per gateway. The
// ClickHouse server gateways 0 and 2 write through (shard 1's first replica) is
// SIGKILLed; later both replicas of shard 2 are cut from everything for
// 10 s (full form: 30 s); after the heal the killed server restarts. Once
// every gateway's spool and write-ahead log are empty and the replicas of
// each shard agree, every answered call is stored once, read through the
// Distributed table.
func TestDrillClickHouseReplicaKilledShardCut(t *testing.T) {
	cut := 10 * time.Second
	if drillsFull() {
		cut = 30 * time.Second
	}
	began := time.Now()
	var d *chDrill
	spool := t.TempDir()
	c := newClusterWith(t, 3, 4, clusterOptions{
		setup: func(c *cluster) { d = startCHCluster(c) },
		gatewayArgs: func(i int) []string {
			return []string{"--clickhouse", d.dsn(i), "--spool-dir", filepath.Join(spool, fmt.Sprintf("gw%d", i))}
		},
	})
	ready := time.Since(began)
	load := c.runAgents(6, func(a, _ int) int { return a % 3 })
	// each is true when every gateway answered at least n calls started after from.
	each := func(from time.Time, n int) bool {
		for i := range c.gws {
			if answeredSince(load, from, i) < n {
				return false
			}
		}
		return true
	}
	sum := func(metric string) float64 {
		v := 0.0
		for _, g := range c.gws {
			v += metricSum(t, g.addr, metric)
		}
		return v
	}
	waitUntil(t, "every gateway answering", 20*time.Second, func() bool { return each(time.Time{}, 20) })

	killed := d.cl.Shards[0][0]
	killAt := time.Now()
	killed.Kill()
	waitUntil(t, "calls answered on every gateway after the kill", 20*time.Second, func() bool { return each(killAt, 20) })

	cutAt := time.Now()
	for _, n := range d.cl.Shards[1] {
		c.n.Isolate(d.hosts[n])
	}
	time.Sleep(cut) // the cut's length: the drill's scenario, not a wait for a condition
	answeredInCut := answeredSince(load, cutAt, -1)
	spilled := sum("rollgate_spool_spilled_rows_total")
	healAt := time.Now()
	c.n.HealAll()
	killed.Start(t)
	atHeal := c.spooled()
	// The load goes on as long again as the cut: does the replay catch up
	// with what the agents add meanwhile?
	time.Sleep(cut) // the drill's scenario, not a wait for a condition
	if !each(healAt, 1) {
		t.Errorf("a gateway answered no call after the heal")
	}
	underLoad := time.Since(healAt)
	atHalt := c.spooled()
	calls := load.halt()
	haltAt := time.Now()
	testenv.WaitFor(t, 120*time.Second, func() string { return "the gateways' spools drained after the load" + c.readyz() + d.state(t) }, c.drained)
	drain := time.Since(haltAt)
	replayed := sum("rollgate_spool_replayed_rows_total")
	for _, g := range c.gws {
		stop(t, g.cmd, g.logs) // SIGTERM: capture flushed
	}
	var diff string
	testenv.WaitFor(t, 60*time.Second, func() string { return "the replicas in sync: " + diff + d.state(t) }, func() bool { diff = d.inSync(t); return diff == "" })
	rep := tally(fmt.Sprintf("e. ClickHouse replica killed, shard cut %s", cut), calls, d.storedRows(t, d.cl.Shards[1][1]))
	rep.Recover = -1
	t.Logf("drill table row:\n%s", rep)
	t.Logf("cluster and gateways ready in %s; %d calls answered during the cut, %v rows spilled to the spools, %v replayed; spooled batches at the heal %d, %s later under load %d; drained %s after the load stopped; %d rows stored for calls no agent saw answered; wall time %s",
		ready.Round(10*time.Millisecond), answeredInCut, spilled, replayed, atHeal, underLoad.Round(10*time.Millisecond), atHalt,
		drain.Round(10*time.Millisecond), rep.Stored-rep.Answered, time.Since(began).Round(10*time.Millisecond))

	if rep.Repeated != 0 || rep.Missing != 0 || rep.Duplicated != 0 || rep.Order != 0 {
		t.Errorf("repeated %d, missing %d, duplicated %d, out of order %d: want all 0", rep.Repeated, rep.Missing, rep.Duplicated, rep.Order)
	}
	if spilled == 0 || replayed == 0 {
		t.Errorf("%v rows spilled, %v replayed: the drill did not exercise the spool", spilled, replayed)
	}
	if rep.Failed != 0 || rep.Refused != 0 {
		t.Errorf("%d calls refused, %d failed: a store outage must not reach the agents", rep.Refused, rep.Failed)
	}
	if atHeal > 0 && atHalt >= atHeal {
		t.Errorf("the spools held %d batches at the heal and %d after %s more of load: the replay did not catch up", atHeal, atHalt, underLoad.Round(10*time.Millisecond))
	}
}
