package deploytest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export"
	chstore "github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/export/storetest"
	"github.com/rollgate/rollgate/testkit/chcluster"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// contractTables are the tables deploy/clickhouse/cluster.sql creates, each as
// <name>_local (ReplicatedMergeTree) plus <name> (Distributed).
var contractTables = []string{"llm_calls", "rewards", "rollouts", "agent_spans"}

// clusterStatements reads deploy/clickhouse/cluster.sql and returns its
// statements with the database renamed from rollgate to db (as its header
// tells users to do), comments dropped.
func clusterStatements(t testing.TB, db string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir(t), "clickhouse", "cluster.sql"))
	if err != nil {
		t.Fatal(err)
	}
	return chcluster.Statements(string(b), db)
}

// applyClusterDDL runs cluster.sql (database db) on node n.
func applyClusterDDL(t testing.TB, n *chcluster.Node, db string) {
	t.Helper()
	n.Exec(t, clusterStatements(t, db))
}

// column is one row of system.columns.
type column struct {
	Name, Type string
}

func tableColumns(t testing.TB, n *chcluster.Node, db, table string) []column {
	t.Helper()
	rows, err := n.Connect(t).Query(context.Background(),
		"SELECT name, type FROM system.columns WHERE database = ? AND table = ?", db, table) // in table order (18.16 has no position column)
	if err != nil {
		t.Fatalf("columns of %s.%s on %s: %v", db, table, n.Name, err)
	}
	defer rows.Close()
	var out []column
	for rows.Next() {
		var c column
		if err := rows.Scan(&c.Name, &c.Type); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		t.Fatalf("%s.%s on %s has no columns (missing table?)", db, table, n.Name)
	}
	return out
}

// queryStrings runs a query returning one String column per row.
func queryStrings(t testing.TB, n *chcluster.Node, q string, args ...any) []string {
	t.Helper()
	rows, err := n.Connect(t).Query(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("%s on %s: %v", q, n.Name, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

func countRows(t testing.TB, n *chcluster.Node, table string) uint64 {
	t.Helper()
	var c uint64
	if err := n.Connect(t).QueryRow(context.Background(), "SELECT count() FROM "+table).Scan(&c); err != nil {
		t.Fatalf("count %s on %s: %v", table, n.Name, err)
	}
	return c
}

// TestClickHouseClusterDDL applies deploy/clickhouse/cluster.sql to a real
// cluster (Debian's ZooKeeper and four ClickHouse servers as two shards of two
// replicas, all on loopback) and uses it through rollgate's ClickHouse store:
// the tables' columns equal those the store creates on a single server, the
// store works on the Distributed tables (writes from one server, reads from
// a server of the other shard, replicas agree, a rollout's rows stay on one
// shard), and the store conformance suite and the saved queries of deploy/sql
// pass on the cluster, and the real `rollgate serve --clickhouse` captures to
// it and answers from it.
func TestClickHouseClusterDDL(t *testing.T) {
	zk := chcluster.StartZooKeeper(t, chcluster.Placement{})
	cl := chcluster.Start(t, chcluster.Options{Name: "rollgate_test", ZooKeeper: zk, Shards: 2, Replicas: 2})
	nodes := cl.Nodes()
	first, other := cl.Shards[0][0], cl.Shards[1][1]
	ctx := context.Background()

	// Every server reaches ZooKeeper before distributed DDL is sent.
	for _, n := range nodes {
		n := n
		waitCond(t, n.Name+" connected to ZooKeeper", 30*time.Second, func() error {
			var c uint64
			return n.Connect(t).QueryRow(ctx, "SELECT count() FROM system.zookeeper WHERE path = '/'").Scan(&c)
		})
	}
	applyClusterDDL(t, first, "rollgate")

	t.Run("columns equal the store's", func(t *testing.T) {
		// The store creates its single-server tables in database "single".
		s, err := chstore.Open(ctx, first.DSN("single"), chstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		storeTables := queryStrings(t, first, "SELECT name FROM system.tables WHERE database = 'single' ORDER BY name")
		want := slices.Clone(contractTables)
		slices.Sort(want)
		if !slices.Equal(storeTables, want) {
			t.Fatalf("the store creates tables %v; cluster.sql covers %v: add the new table to deploy/clickhouse/cluster.sql", storeTables, want)
		}
		for _, table := range contractTables {
			single := tableColumns(t, first, "single", table)
			for _, n := range nodes {
				for _, name := range []string{table, table + "_local"} {
					if got := tableColumns(t, n, "rollgate", name); !slices.Equal(got, single) {
						t.Errorf("rollgate.%s on %s has columns\n%v\nthe store creates\n%v\nupdate deploy/clickhouse/cluster.sql", name, n.Name, got, single)
					}
				}
			}
			engines := map[string]string{}
			for _, name := range []string{table, table + "_local"} {
				e := queryStrings(t, other, "SELECT engine FROM system.tables WHERE database = 'rollgate' AND name = ?", name)
				if len(e) == 1 {
					engines[name] = e[0]
				}
			}
			if engines[table] != "Distributed" || !strings.HasPrefix(engines[table+"_local"], "Replicated") {
				t.Errorf("%s engines %v, want Distributed over Replicated*MergeTree", table, engines)
			}
		}
	})

	t.Run("store on the distributed tables", func(t *testing.T) {
		w, err := chstore.Open(ctx, first.DSN("rollgate"), chstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		// Open found the tables and created none of its own.
		for _, table := range contractTables {
			if e := queryStrings(t, first, "SELECT engine FROM system.tables WHERE database = 'rollgate' AND name = ?", table); !slices.Equal(e, []string{"Distributed"}) {
				t.Fatalf("after Open, rollgate.%s has engine %v", table, e)
			}
		}
		b := storetest.SampleBatch()
		for i := 0; i < 20; i++ {
			r := fmt.Sprintf("rollout-%02d", i)
			b.Calls = append(b.Calls, storetest.EmptyCall(r, "a1", 1))
			b.Rewards = append(b.Rewards, export.Reward{RolloutID: r, AttemptID: "a1", Name: "primary", Value: float64(i), Source: "api", TimeUnixNano: 1_700_000_300_000_000_000})
			b.Rollouts = append(b.Rollouts, export.Rollout{RolloutID: r, AttemptID: "a1", TaskID: "t", Status: "succeeded", Metadata: "{}", CreatedUnixNano: 1, UpdatedUnixNano: 2})
			b.Spans = append(b.Spans, export.Span{RolloutID: r, AttemptID: "a1", TraceID: strings.Repeat("ab", 16), SpanID: fmt.Sprintf("%016x", i), Name: "tool", StartTimeUnixNano: 1_700_000_000_000_000_000 + uint64(i)})
		}
		for i := 0; i < 10; i++ { // unattributed calls spread by span id
			c := storetest.EmptyCall("", "", 0)
			c.SpanID = fmt.Sprintf("unattributed-%d", i)
			b.Calls = append(b.Calls, c)
		}
		if err := w.Write(ctx, b); err != nil {
			t.Fatal(err)
		}

		// Read back at once (insert_distributed_sync=1) through a server of the other shard.
		r, err := chstore.Open(ctx, other.DSN("rollgate"), chstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for _, s := range []*chstore.Store{w, r} {
			calls, err := s.Calls(ctx, export.CallFilter{})
			if err != nil {
				t.Fatal(err)
			}
			if len(calls) != len(b.Calls) {
				t.Errorf("%s: read %d calls, wrote %d", s.Database(), len(calls), len(b.Calls))
			}
			d, err := s.Rollout(ctx, "r1")
			if err != nil {
				t.Fatal(err)
			}
			if len(d.Attempts) != 1 || d.Attempts[0].Status != "succeeded" || len(d.Calls) != 3 || len(d.Rewards) != 2 {
				t.Errorf("rollout r1: attempts %+v, %d calls, %d rewards; want the latest status succeeded, 3 calls, 2 rewards", d.Attempts, len(d.Calls), len(d.Rewards))
			}
			if got := storetest.EqualCalls(d.Calls[:2], b.Calls[:2]); got != "" {
				t.Errorf("rollout r1 calls read back differ: %s", got)
			}
		}

		// Replicas of a shard converge to the same rows; shards split the rows.
		for _, table := range contractTables {
			var total uint64
			for si, shard := range cl.Shards {
				want := countRows(t, shard[0], "rollgate."+table+"_local")
				waitCond(t, fmt.Sprintf("replica %s of %s_local", shard[1].Name, table), 60*time.Second, func() error {
					if got := countRows(t, shard[1], "rollgate."+table+"_local"); got != want {
						return fmt.Errorf("%d rows, replica %s has %d", got, shard[0].Name, want)
					}
					return nil
				})
				if want == 0 {
					t.Errorf("shard %d holds no %s rows: sharding put everything on one shard", si+1, table)
				}
				total += want
			}
			if all := countRows(t, other, "rollgate."+table); total != all {
				t.Errorf("%s: shards hold %d rows, the Distributed table reads %d", table, total, all)
			}
		}
		// One rollout's rows are on one shard, the same for every table.
		for _, rollout := range []string{"r1", "r2", "r3", "rollout-07"} {
			var where []int
			for si, shard := range cl.Shards {
				n := uint64(0)
				for _, table := range []string{"llm_calls", "rewards", "rollouts"} {
					var c uint64
					if err := shard[0].Connect(t).QueryRow(ctx, "SELECT count() FROM rollgate."+table+"_local WHERE rollout_id = ?", rollout).Scan(&c); err != nil {
						t.Fatal(err)
					}
					n += c
				}
				if n > 0 {
					where = append(where, si+1)
				}
			}
			if len(where) != 1 {
				t.Errorf("rollout %s has rows on shards %v, want exactly one", rollout, where)
			}
		}
	})

	// The real binary: rollgate serve --clickhouse pointed at the Distributed
	// tables (built-in mock engine), a rollout's calls, reward and status
	// through the gateway, read back through its API.
	t.Run("rollgate serve", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "rollgate")
		build := exec.Command("go", "build", "-o", bin, "./cmd/rollgate")
		build.Dir = filepath.Join(deployDir(t), "..")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/rollgate: %v\n%s", err, out)
		}
		applyClusterDDL(t, first, "served")
		port, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		serve := exec.Command(bin, "serve", "--listen", addr, "--clickhouse", first.DSN("served"),
			"--spool-dir", filepath.Join(t.TempDir(), "spool"))
		serve.Dir = t.TempDir() // anything it writes by default stays in the test's folder
		gw := chcluster.StartProcess(t, "rollgate serve", serve)
		base := "http://" + addr
		// Ready, and connected to the store: with --spool-dir the gateway
		// is ready while ClickHouse is still connecting (calls wait in the
		// spool), but rewards and status are stored directly, so the test
		// waits for "store":"up" before posting them.
		gw.WaitUntil(t, 60*time.Second, func() error {
			res, err := http.Get(base + "/readyz")
			if err != nil {
				return err
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 200 || !strings.Contains(string(b), `"store":"up"`) {
				return fmt.Errorf("/readyz: %s %s", res.Status, b)
			}
			return nil
		}, func() string { return "" })
		post := func(path, body string) {
			t.Helper()
			res, err := http.Post(base+path, "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 200 {
				t.Fatalf("POST %s: %s %s", path, res.Status, b)
			}
		}
		for _, r := range []string{"served-1", "served-2", "served-3"} {
			for turn := 0; turn < 2; turn++ {
				post("/rollout/"+r+"/attempt/a1/v1/chat/completions", `{"model":"mock-model","messages":[{"role":"user","content":"hi"}]}`)
			}
			post("/api/v1/rollouts/"+r+"/rewards", `{"value": 1, "attempt_id": "a1"}`)
			post("/api/v1/rollouts/"+r+"/status", `{"status": "succeeded", "attempt_id": "a1"}`)
		}
		for _, r := range []string{"served-1", "served-2", "served-3"} {
			res, err := http.Get(base + "/api/v1/rollouts/" + r)
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Calls   []json.RawMessage `json:"calls"`
				Rewards []json.RawMessage `json:"rewards"`
			}
			err = json.NewDecoder(res.Body).Decode(&got)
			res.Body.Close()
			if err != nil || res.StatusCode != 200 {
				t.Fatalf("GET rollout %s: %s %v", r, res.Status, err)
			}
			if len(got.Calls) != 2 || len(got.Rewards) != 1 {
				t.Errorf("rollout %s through the gateway: %d calls, %d rewards; want 2 and 1", r, len(got.Calls), len(got.Rewards))
			}
		}
		var local uint64
		for _, shard := range cl.Shards {
			local += countRows(t, shard[0], "served.llm_calls_local")
		}
		if local != 6 {
			t.Errorf("the shards' llm_calls_local hold %d rows, want the 6 calls", local)
		}
	})

	// The conformance suite every store passes, on the cluster: each subtest
	// gets a database of its own made by cluster.sql.
	t.Run("conformance", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) export.Store {
			db := testenv.Identifier("c_" + t.Name())
			applyClusterDDL(t, first, db)
			s, err := chstore.Open(ctx, first.DSN(db), chstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return s
		})
	})

	// Tables made by the cluster.sql of a release before rollouts.group_id:
	// the store does not alter Distributed tables but stops and names the
	// ALTER; the upgrade the header of cluster.sql gives makes them work.
	t.Run("upgrade without group_id", func(t *testing.T) {
		conn := first.Connect(t)
		for _, stmt := range clusterStatements(t, "upgraded") {
			stmt = strings.Replace(stmt, "    group_id String,\n", "", 1)
			if err := conn.Exec(ctx, stmt); err != nil {
				t.Fatalf("old cluster.sql: %v\n%s", err, stmt)
			}
		}
		_, err := chstore.Open(ctx, first.DSN("upgraded"), chstore.Options{})
		if err == nil || !strings.Contains(err.Error(), "ALTER TABLE upgraded.rollouts_local ON CLUSTER '{cluster}' ADD COLUMN group_id String AFTER task_id") {
			t.Fatalf("Open on Distributed tables without group_id: %v; want an error naming the ALTER on rollouts_local", err)
		}
		b, err := os.ReadFile(filepath.Join(deployDir(t), "clickhouse", "cluster.sql"))
		if err != nil {
			t.Fatal(err)
		}
		var alters int
		for _, l := range strings.Split(string(b), "\n") {
			stmt, ok := strings.CutPrefix(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "--")), "ALTER TABLE ")
			if !ok {
				continue
			}
			stmt = "ALTER TABLE " + regexp.MustCompile(`\brollgate\b`).ReplaceAllString(strings.TrimSuffix(stmt, ";"), "upgraded")
			on := nodes // without ON CLUSTER: on every server, as the header says
			if strings.Contains(stmt, " ON CLUSTER ") {
				on = []*chcluster.Node{first}
			}
			for _, n := range on {
				if err := n.Connect(t).Exec(ctx, stmt); err != nil {
					t.Fatalf("the upgrade in cluster.sql's header, on %s: %v\n%s\n%s", n.Name, err, stmt, cl.Diagnose())
				}
			}
			alters++
		}
		if alters != 2 {
			t.Fatalf("cluster.sql's header gives %d ALTER statements, want 2 (rollouts_local on the cluster, then rollouts on every server)", alters)
		}
		ref, err := chstore.Open(ctx, first.DSN("upgrade_ref"), chstore.Options{}) // a new single-server table
		if err != nil {
			t.Fatal(err)
		}
		ref.Close()
		want := tableColumns(t, first, "upgrade_ref", "rollouts")
		for _, n := range nodes {
			for _, name := range []string{"rollouts", "rollouts_local"} {
				n, name := n, name
				waitCond(t, "group_id on "+n.Name+" upgraded."+name, 60*time.Second, func() error {
					if got := tableColumns(t, n, "upgraded", name); !slices.Equal(got, want) {
						return fmt.Errorf("columns %v, want %v", got, want)
					}
					return nil
				})
			}
		}
		s, err := chstore.Open(ctx, first.DSN("upgraded"), chstore.Options{})
		if err != nil {
			t.Fatalf("Open after the upgrade: %v", err)
		}
		defer s.Close()
		row := export.Rollout{RolloutID: "up-1", AttemptID: "a1", TaskID: "t", GroupID: "g-up", Status: "succeeded", Metadata: "{}", CreatedUnixNano: 1, UpdatedUnixNano: 2}
		if err := s.Write(ctx, &export.Batch{Rollouts: []export.Rollout{row}}); err != nil {
			t.Fatal(err)
		}
		d, err := s.Rollout(ctx, "up-1")
		if err != nil || len(d.Attempts) != 1 || d.Attempts[0] != row {
			t.Fatalf("rollout after the upgrade: %+v %v", d, err)
		}
	})

	t.Run("deploy/sql", func(t *testing.T) {
		applyClusterDDL(t, first, "saved_queries")
		s, err := chstore.Open(ctx, other.DSN("saved_queries"), chstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		storetest.RunQueryFiles(t, s, filepath.Join(deployDir(t), "sql"))
	})
}

// waitCond polls cond every 200 ms until it returns nil or timeout passes.
func waitCond(t testing.TB, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond) // polling interval: cond is the condition
	}
}
