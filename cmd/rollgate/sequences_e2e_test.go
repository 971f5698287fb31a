package main

import (
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollgate/rollgate/testkit/testenv"
)

// seqCall makes one chat call of (rollout, attempt) through the gateway at
// addr and returns its x-sequence-id.
func seqCall(addr, rollout, attempt string) (uint64, error) {
	body := `{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	r, err := http.Post("http://"+addr+"/rollout/"+rollout+"/attempt/"+attempt+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	r.Body.Close()
	if r.StatusCode != 200 {
		return 0, fmt.Errorf("status %d", r.StatusCode)
	}
	return strconv.ParseUint(r.Header.Get("x-sequence-id"), 10, 64)
}

// gatewayProc is a rollgate serve process that can be restarted on the
// same address with the same arguments.
type gatewayProc struct {
	t    *testing.T
	addr string
	args []string
	cmd  *exec.Cmd
	logs *syncBuffer
}

func startGateway(t *testing.T, args ...string) *gatewayProc {
	g := &gatewayProc{t: t, addr: freeAddr(t), args: args}
	g.start()
	return g
}

func (g *gatewayProc) start() {
	g.t.Helper()
	g.cmd = exec.Command(binary, append([]string{"serve", "--listen", g.addr, "--log-level", "warn"}, g.args...)...)
	g.logs = startCmd(g.t, g.cmd, g.addr)
}

func (g *gatewayProc) restart() {
	g.t.Helper()
	stop(g.t, g.cmd, g.logs)
	g.start()
}

// kill9 kills the gateway with SIGKILL and starts it again.
func (g *gatewayProc) kill9() {
	g.t.Helper()
	if err := g.cmd.Process.Kill(); err != nil {
		g.t.Fatal(err)
	}
	g.cmd.Wait() // "signal: killed"
	g.start()
}

// sqlCountOn runs a count query with rollgate sql on the store its flags
// name (--db FILE or --clickhouse DSN) and returns its value.
func sqlCountOn(t *testing.T, query string, store ...string) int {
	t.Helper()
	out := runCmd(t, append(append([]string{"sql"}, store...), query)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 3 {
		t.Fatalf("rollgate sql %q:\n%s", query, out)
	}
	n, err := strconv.Atoi(strings.TrimSpace(lines[2]))
	if err != nil {
		t.Fatalf("rollgate sql %q: %v\n%s", query, err, out)
	}
	return n
}

// chCount runs a count query on ClickHouse with rollgate sql.
func chCount(t *testing.T, dsn, query string) int {
	t.Helper()
	return sqlCountOn(t, query, "--clickhouse", dsn)
}

// TestSequenceIDsAcrossGatewaysAndRestarts: two gateways on one PostgreSQL
// (--queue) capturing to one ClickHouse; rollouts whose calls alternate
// between them (each call after the previous answer), one gateway restarted
// (SIGTERM) after the first third, the other killed (SIGKILL) and started
// again after the second. Every answer's id is above the rollout's previous
// one, the store holds every call of the first two thirds once (the killed
// gateway's last calls are waited for in the store before the kill), and no
// (rollout, attempt, sequence_id, retry_count) twice (none is a retry).
func TestSequenceIDsAcrossGatewaysAndRestarts(t *testing.T) {
	pg, stopPG, err := testenv.StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	defer stopPG()
	if pg, err = testenv.FreshPostgresDatabase(pg, t.Name()); err != nil {
		t.Fatal(err)
	}
	ch, stopCH, err := testenv.StartClickHouse()
	if err != nil {
		t.Fatal(err)
	}
	defer stopCH()
	ch = testenv.FreshDatabase(ch, "seq_e2e_"+strconv.FormatInt(time.Now().UnixNano(), 10))
	dir := t.TempDir()
	gws := []*gatewayProc{
		startGateway(t, "--queue", pg, "--clickhouse", ch, "--db", filepath.Join(dir, "a.db")),
		startGateway(t, "--queue", pg, "--clickhouse", ch, "--db", filepath.Join(dir, "b.db")),
	}
	const rollouts, calls = 6, 60
	lastIDs := make([]uint64, rollouts) // each rollout's last id, between the phases
	var answered sync.WaitGroup
	phase := func(from, to int) {
		errs := make(chan error, rollouts)
		for r := 0; r < rollouts; r++ {
			answered.Add(1)
			go func(r int) {
				defer answered.Done()
				rollout := fmt.Sprintf("ro-%d", r)
				last := lastIDs[r]
				for i := from; i < to; i++ {
					// Rollout r alternates every (r%3)+1 calls.
					g := gws[(i/((r%3)+1))%2]
					id, err := seqCall(g.addr, rollout, "at-1")
					if err != nil {
						errs <- fmt.Errorf("%s call %d on %s: %v", rollout, i, g.addr, err)
						return
					}
					if id <= last {
						errs <- fmt.Errorf("%s call %d on %s: sequence id %d after %d", rollout, i, g.addr, id, last)
						return
					}
					last = id
				}
				lastIDs[r] = last
			}(r)
		}
		answered.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	countIn := func(q string) func() bool {
		return func() bool { return chCount(t, ch, q) == rollouts*calls*2/3 }
	}
	phase(0, calls/3)
	gws[0].restart()
	phase(calls/3, calls*2/3)
	waitUntil(t, "the calls answered so far in ClickHouse", 30*time.Second,
		countIn("SELECT count() AS n FROM llm_calls WHERE rollout_id LIKE 'ro-%'"))
	gws[1].kill9()
	phase(calls*2/3, calls)
	// The gateways took attempts over from each other, with the handshake.
	if n := metricSum(t, gws[0].addr, `rollgate_sequence_takeovers_total{outcome="acked"}`) +
		metricSum(t, gws[1].addr, `rollgate_sequence_takeovers_total{outcome="acked"}`); n == 0 {
		t.Fatal("no acknowledged takeover counted")
	}
	for _, g := range gws {
		if n := metricSum(t, g.addr, `rollgate_calls_rejected_total{reason="sequence_store"}`); n != 0 {
			t.Fatalf("%s refused %v calls for want of a sequence id", g.addr, n)
		}
		stop(t, g.cmd, g.logs)
	}
	if n := chCount(t, ch, "SELECT count() AS n FROM llm_calls WHERE rollout_id LIKE 'ro-%'"); n < rollouts*calls*2/3 || n > rollouts*calls {
		t.Fatalf("%d calls stored, want %d to %d", n, rollouts*calls*2/3, rollouts*calls)
	}
	// The tries of one call share its sequence id (retry_count tells them
	// apart); these calls are never retried, so none may be taken for one.
	if n := chCount(t, ch, "SELECT count() AS n FROM (SELECT rollout_id, attempt_id, sequence_id, retry_count FROM llm_calls GROUP BY rollout_id, attempt_id, sequence_id, retry_count HAVING count() > 1)"); n != 0 {
		t.Fatalf("%d (rollout, attempt, sequence_id, retry_count) stored more than once", n)
	}
	if n := chCount(t, ch, "SELECT count() AS n FROM llm_calls WHERE rollout_id LIKE 'ro-%' AND retry_count > 0"); n != 0 {
		t.Fatalf("%d calls stored as retries, none was one", n)
	}
}

// TestSequenceIDsSurviveRestart: one gateway on the embedded store, and one
// capturing to ClickHouse (ids in the SQLite file --db), restarted between
// calls: the attempt continues above its last id, and a new attempt starts
// at 1.
func TestSequenceIDsSurviveRestart(t *testing.T) {
	f := func(t *testing.T, args ...string) {
		g := startGateway(t, args...)
		var last uint64
		for round := 0; round < 3; round++ {
			for i := 0; i < 5; i++ {
				id, err := seqCall(g.addr, "ro-restart", "at-1")
				if err != nil {
					t.Fatal(err)
				}
				if id <= last {
					t.Fatalf("round %d: id %d after %d", round, id, last)
				}
				last = id
			}
			g.restart()
		}
		if id, err := seqCall(g.addr, "ro-restart", "at-2"); err != nil || id != 1 {
			t.Fatalf("a new attempt: id %d, %v; want 1", id, err)
		}
		stop(t, g.cmd, g.logs)
	}
	t.Run("sqlite", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "rollgate.db")
		f(t, "--db", db)
		if n := sqlCount(t, db, "SELECT count(*) AS n FROM (SELECT 1 FROM llm_calls GROUP BY rollout_id, attempt_id, sequence_id HAVING count(*) > 1)"); n != 0 {
			t.Fatalf("%d ids stored twice", n)
		}
	})
	t.Run("clickhouse", func(t *testing.T) {
		ch, stopCH, err := testenv.StartClickHouse()
		if err != nil {
			t.Fatal(err)
		}
		defer stopCH()
		ch = testenv.FreshDatabase(ch, "seq_restart_"+strconv.FormatInt(time.Now().UnixNano(), 10))
		f(t, "--clickhouse", ch, "--db", filepath.Join(t.TempDir(), "queue.db"))
		if n := chCount(t, ch, "SELECT count() AS n FROM (SELECT rollout_id, attempt_id, sequence_id FROM llm_calls GROUP BY rollout_id, attempt_id, sequence_id HAVING count() > 1)"); n != 0 {
			t.Fatalf("%d ids stored twice", n)
		}
		if n := chCount(t, ch, "SELECT count() AS n FROM llm_calls WHERE rollout_id = 'ro-restart'"); n != 16 {
			t.Fatalf("%d calls stored, want 16", n)
		}
	})
}
