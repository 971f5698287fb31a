//go:build linux

package main

import (
	"bufio"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite" // reads the gateways' --db files

	"github.com/rollgate/rollgate/testkit/netns"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// envDrills selects the drills' form: unset or "short" runs the short form
// (part of the normal test run), "full" the long ones (scripts/drills).
const envDrills = "ROLLGATE_DRILLS"

// drillsFull tells whether the full form was asked for.
func drillsFull() bool { return os.Getenv(envDrills) == "full" }

// drillLease is the gateways' --sequence-lease in the drills (the default).
const drillLease = 4 * time.Second

// cluster is the drills' deployment: PostgreSQL on a host of its own,
// gateways on theirs (each capturing to its own SQLite --db), mock engines
// on theirs; the agents run in the test process.
type cluster struct {
	t       *testing.T
	n       *netns.Net
	pg      *netns.Host
	pgDSN   string
	engines []*netns.Host
	gws     []*nsGateway
	dir     string
}

// nsGateway is a rollgate serve process on a host of its own.
type nsGateway struct {
	h    *netns.Host
	addr string
	db   string
	args []string // serve's arguments (startGateway)
	cmd  *exec.Cmd
	logs *syncBuffer
}

// newCluster starts PostgreSQL, the engines and the gateways, each on a
// host of its own.
func newCluster(t *testing.T, gateways, engines int) *cluster {
	t.Helper()
	return newClusterWith(t, gateways, engines, clusterOptions{})
}

// clusterOptions are what a drill changes in newCluster's deployment.
type clusterOptions struct {
	// gatewayDSN, when set, gives the PostgreSQL DSN the gateways use (a
	// path through a relay host, say); it runs once PostgreSQL is up.
	gatewayDSN func(c *cluster) string
	// engineArgs replace the mock engines' default pace (--itl 2ms
	// --max-tokens 8).
	engineArgs []string
	// gatewayArgs, when set, gives gateway i's serve flags added to the
	// common ones.
	gatewayArgs func(i int) []string
	// setup, when set, runs once PostgreSQL and the engines are up, before
	// the gateways start: the drill's own servers (a store the gateways
	// capture to, say).
	setup func(c *cluster)
}

// newClusterWith is newCluster with options.
func newClusterWith(t *testing.T, gateways, engines int, o clusterOptions) *cluster {
	t.Helper()
	c := &cluster{t: t, n: netns.New(t), dir: t.TempDir()}
	c.pg = c.n.Host("pg")
	dsn, stopPG, err := testenv.StartPostgresWith(testenv.PostgresOptions{Listen: c.pg.IP.String(), Port: 5432, Command: c.pg.Command})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopPG)
	c.pgDSN = dsn
	var upstreams []string
	for i := range engines {
		h := c.n.Host(fmt.Sprintf("engine%d", i))
		pace := []string{"--itl", "2ms", "--max-tokens", "8"}
		if o.engineArgs != nil {
			pace = o.engineArgs
		}
		cmd := h.Command(binary, append([]string{"mock", "--listen", h.Addr(8001)}, pace...)...)
		logs := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		waitUntil(t, "the mock engine on "+h.Name, 20*time.Second, func() bool {
			r, err := http.Get("http://" + h.Addr(8001) + "/v1/models")
			if err == nil {
				r.Body.Close()
			}
			return err == nil && r.StatusCode == 200
		})
		c.engines = append(c.engines, h)
		upstreams = append(upstreams, fmt.Sprintf("      - {name: e%d, url: \"http://%s/v1\", kind: vllm}", i, h.Addr(8001)))
	}
	cfg := filepath.Join(c.dir, "rollgate.yaml")
	if err := os.WriteFile(cfg, []byte("backends:\n  - model: \"*\"\n    replicas:\n"+strings.Join(upstreams, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if o.setup != nil {
		o.setup(c)
	}
	gwDSN := c.pgDSN
	if o.gatewayDSN != nil {
		gwDSN = o.gatewayDSN(c)
	}
	for i := range gateways {
		h := c.n.Host(fmt.Sprintf("gw%d", i))
		g := &nsGateway{h: h, addr: h.Addr(8000), db: filepath.Join(c.dir, fmt.Sprintf("gw%d.db", i))}
		g.args = []string{"serve", "--listen", g.addr, "--config", cfg, "--queue", gwDSN, "--db", g.db,
			"--sequence-lease", drillLease.String(), "--idle-timeout", "3s", "--insecure-admin", "--log-level", "warn"}
		if o.gatewayArgs != nil {
			g.args = append(g.args, o.gatewayArgs(i)...)
		}
		t.Cleanup(func() {
			if g.cmd != nil && g.cmd.Process != nil {
				g.cmd.Process.Kill()
				g.cmd.Wait()
			}
			if t.Failed() { // what the gateway said is the drill's evidence
				t.Logf("log of the gateway on %s:\n%s", g.h.Name, g.logs)
			}
		})
		c.startGateway(g)
		c.gws = append(c.gws, g)
	}
	return c
}

// startGateway starts g's serve process on its host (again, after a kill:
// same flags, same --db) and waits until it is ready.
func (c *cluster) startGateway(g *nsGateway) {
	c.t.Helper()
	g.cmd = g.h.Command(binary, g.args...)
	g.logs = &syncBuffer{}
	g.cmd.Stdout, g.cmd.Stderr = g.logs, g.logs
	if err := g.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	testenv.WaitFor(c.t, 20*time.Second, func() string { return "the gateway on " + g.h.Name + " ready:\n" + g.logs.String() }, func() bool {
		r, err := http.Get("http://" + g.addr + "/readyz")
		if err == nil {
			r.Body.Close()
		}
		return err == nil && r.StatusCode == 200
	})
}

// drillCall is one agent call and its outcome.
type drillCall struct {
	rollout string
	gw      int
	start   time.Time
	end     time.Time
	status  int // 0: no answer (transport error, or a stream cut short)
	seq     uint64
	// How a call without an answer ended: errEvent, its stream ended with
	// an error event (data: {"error":...}) and no [DONE]; truncated, its
	// stream just stopped (neither); otherwise no response at all.
	errEvent, truncated bool
}

// agentLoad runs agents until stop is closed: agent i calls gateway
// route(i, turn) for rollout "dr-i" turn after turn (each call a streamed
// chat call whose history grows, the next made after the previous
// answer), and records every call.
type agentLoad struct {
	mu    sync.Mutex
	calls []drillCall
	wg    sync.WaitGroup
	stop  chan struct{}
}

func (c *cluster) runAgents(agents int, route func(agent, turn int) int) *agentLoad {
	return c.runAgentsWith(agents, route, agentOptions{})
}

// agentOptions are how a drill's agents differ from runAgents' ones.
type agentOptions struct {
	// failover: an agent whose call got no response, or whose answer
	// broke off (a gateway down), moves on to the next gateway for the rest of its run, as a
	// client library with several base URLs does; route then gives only
	// its first gateway.
	failover bool
	// timeout bounds each call (dial included: at most 1 s of it); 0 is
	// 15 s.
	timeout time.Duration
}

// runAgentsWith is runAgents with options.
func (c *cluster) runAgentsWith(agents int, route func(agent, turn int) int, o agentOptions) *agentLoad {
	l := &agentLoad{stop: make(chan struct{})}
	client := &http.Client{Timeout: 15 * time.Second}
	if o.timeout > 0 {
		client = &http.Client{Timeout: o.timeout, Transport: &http.Transport{DialContext: (&net.Dialer{Timeout: time.Second}).DialContext}}
	}
	for a := range agents {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rollout := fmt.Sprintf("dr-%d", a)
			history := `{"role":"user","content":"start"}`
			moved := 0
			for turn := 0; ; turn++ {
				select {
				case <-l.stop:
					return
				default:
				}
				gw := route(a, turn)
				if o.failover {
					gw = (route(a, 0) + moved) % len(c.gws)
				}
				call := drillCall{rollout: rollout, gw: gw, start: time.Now()}
				body := `{"model":"mock-model","stream":true,"max_tokens":8,"messages":[` + history + `]}`
				r, err := client.Post("http://"+c.gws[gw].addr+"/rollout/"+rollout+"/attempt/a1/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil && o.failover {
					moved++
				}
				if err == nil {
					complete := false
					sc := bufio.NewScanner(r.Body)
					for sc.Scan() {
						switch line := sc.Text(); {
						case line == "data: [DONE]":
							complete = true
						case strings.HasPrefix(line, `data: {"error"`):
							call.errEvent = true
						}
					}
					if sc.Err() != nil && o.failover { // the connection broke or stalled mid-answer
						moved++
					}
					r.Body.Close()
					if r.StatusCode != 200 || complete {
						call.status = r.StatusCode
					}
					call.truncated = r.StatusCode == 200 && !complete && !call.errEvent
					if call.status == 200 {
						call.seq, _ = strconv.ParseUint(r.Header.Get("x-sequence-id"), 10, 64)
						if len(history) < 4096 {
							history += fmt.Sprintf(`,{"role":"assistant","content":"turn %d"},{"role":"user","content":"go on"}`, turn)
						}
					}
				}
				call.end = time.Now()
				l.mu.Lock()
				l.calls = append(l.calls, call)
				l.mu.Unlock()
				if call.status != 200 {
					select { // an agent backs off a little after a refusal, as a client library does
					case <-l.stop:
						return
					case <-time.After(100 * time.Millisecond):
					}
				}
			}
		}()
	}
	return l
}

// halt stops the agents and returns their calls.
func (l *agentLoad) halt() []drillCall {
	close(l.stop)
	l.wg.Wait()
	return l.calls
}

// drillReport is a drill's line of the table.
type drillReport struct {
	Name                                         string
	Answered, Refused, Failed                    int // 200, 503, anything else
	Stored, Missing, Duplicated, Repeated, Order int
	StopAfter, Recover                           time.Duration // -1: not measured
}

func (r drillReport) String() string {
	d := func(v time.Duration) string {
		if v < 0 {
			return "-"
		}
		return v.Round(10 * time.Millisecond).String()
	}
	return fmt.Sprintf("| %s | %d | %d | %d | %d | %d | %d | %d | %d | %s | %s |", r.Name, r.Answered, r.Refused, r.Failed,
		r.Stored, r.Missing, r.Duplicated, r.Repeated, r.Order, d(r.StopAfter), d(r.Recover))
}

// drillKey names a captured call: its rollout and sequence id.
type drillKey struct {
	rollout string
	seq     uint64
}

// account stops the gateways (SIGTERM: capture flushed), reads every row
// they stored in their SQLite stores and counts what the calls' answers and
// the rows say.
func (c *cluster) account(name string, calls []drillCall) drillReport {
	c.t.Helper()
	stored := map[drillKey]int{}
	for _, g := range c.gws {
		if g.cmd.ProcessState == nil {
			stop(c.t, g.cmd, g.logs)
		}
		db, err := sql.Open("sqlite", "file:"+g.db+"?mode=ro")
		if err != nil {
			c.t.Fatal(err)
		}
		rows, err := db.Query(`SELECT rollout_id, sequence_id FROM llm_calls WHERE rollout_id LIKE 'dr-%'`)
		if err != nil {
			c.t.Fatalf("reading %s: %v", g.db, err)
		}
		for rows.Next() {
			var k drillKey
			if err := rows.Scan(&k.rollout, &k.seq); err != nil {
				c.t.Fatal(err)
			}
			stored[k]++
		}
		rows.Close()
		db.Close()
	}
	return tally(name, calls, stored)
}

// tally counts what the calls' answers and the stored rows (how many rows
// each call has) say.
func tally(name string, calls []drillCall, stored map[drillKey]int) drillReport {
	rep := drillReport{Name: name, StopAfter: -1, Recover: -1}
	answered := map[drillKey]int{}
	last := map[string]uint64{}
	for _, call := range calls {
		switch call.status {
		case 200:
			rep.Answered++
			answered[drillKey{call.rollout, call.seq}]++
			if call.seq <= last[call.rollout] {
				rep.Order++
			}
			last[call.rollout] = call.seq
		case 503:
			rep.Refused++
		default:
			rep.Failed++
		}
	}
	for _, n := range answered {
		if n > 1 {
			rep.Repeated += n - 1
		}
	}
	for _, n := range stored {
		rep.Stored += n
		if n > 1 {
			rep.Duplicated += n - 1
		}
	}
	for k := range answered {
		if stored[k] == 0 {
			rep.Missing++
		}
	}
	return rep
}

// TestDrillGatewayPartitionedFromPostgres (drill a): a gateway host cut
// from PostgreSQL silently (packets dropped, no reset) for 10 s (full form:
// 30 s) while agents keep calling: two pinned to it, two to the other
// gateway, two alternating between them. The cut gateway stops handing out
// ids within --sequence-lease/2 (+ 1 s of slack) and answers 503s it counts;
// the alternating agents' calls on the other gateway take their attempts
// over; every answered call is stored once, no id repeats or goes down
// within a rollout, and the cut gateway answers again after the heal.
func TestDrillGatewayPartitionedFromPostgres(t *testing.T) {
	cut := 10 * time.Second
	if drillsFull() {
		cut = 30 * time.Second
	}
	c := newCluster(t, 2, 1)
	cutGW := c.gws[0]
	load := c.runAgents(6, func(a, turn int) int {
		switch a / 2 {
		case 0:
			return 0
		case 1:
			return 1
		}
		return turn % 2
	})
	waitUntil(t, "every agent answered a few times", 20*time.Second, func() bool { return answeredSince(load, time.Time{}, -1) >= 30 })
	refusedBefore := metricSum(t, cutGW.addr, `rollgate_calls_rejected_total{reason="sequence_store"}`)

	cutAt := time.Now()
	c.n.Cut(cutGW.h, c.pg)
	time.Sleep(cut) // the cut's length: the drill's scenario, not a wait for a condition
	healAt := time.Now()
	c.n.Heal(cutGW.h, c.pg)
	waitUntil(t, "the cut gateway answers again after the heal", 30*time.Second, func() bool { return answeredSince(load, healAt, 0) > 0 })
	recovered := time.Now()
	waitUntil(t, "a few more calls after the recovery", 10*time.Second, func() bool { return answeredSince(load, recovered, 0) >= 5 })
	refused := metricSum(t, cutGW.addr, `rollgate_calls_rejected_total{reason="sequence_store"}`) - refusedBefore
	lost := metricSum(t, cutGW.addr, `rollgate_sequence_session_lost_total{cause="lease"}`)
	calls := load.halt()

	rep := c.account("a. gateway cut from PostgreSQL "+cut.String(), calls)
	var lastOK, firstBack time.Time
	clientRefused := 0
	for _, call := range calls {
		if call.gw != 0 {
			continue
		}
		if call.status == 200 && call.start.After(cutAt) && call.start.Before(healAt) && call.start.After(lastOK) {
			lastOK = call.start
		}
		if call.status == 200 && call.start.After(healAt) && (firstBack.IsZero() || call.end.Before(firstBack)) {
			firstBack = call.end
		}
		// Every 503 from it, wherever the call started: one sent just
		// before the cut is refused after it (and counted then); before the
		// cut nothing is refused (refusedBefore is the baseline).
		if call.status == 503 {
			clientRefused++
		}
	}
	rep.StopAfter = max(0, lastOK.Sub(cutAt))
	rep.Recover = firstBack.Sub(healAt)
	t.Logf("drill table row:\n%s", rep)
	t.Logf("cut gateway: %v refusals counted, %v client-observed 503s, session lost on lease %v times", refused, clientRefused, lost)

	if rep.Repeated != 0 || rep.Missing != 0 || rep.Duplicated != 0 || rep.Order != 0 {
		t.Errorf("repeated %d, missing %d, duplicated %d, out of order %d: want all 0", rep.Repeated, rep.Missing, rep.Duplicated, rep.Order)
	}
	if bound := drillLease/2 + time.Second; rep.StopAfter > bound {
		t.Errorf("the cut gateway handed out ids %s after the cut, want at most %s (--sequence-lease/2 + 1s)", rep.StopAfter, bound)
	}
	if refused == 0 || int(refused) != clientRefused {
		t.Errorf("the cut gateway counted %v refusals, the agents saw %d 503s from it after the cut: want the same, above 0", refused, clientRefused)
	}
	if lost == 0 {
		t.Errorf("rollgate_sequence_session_lost_total{cause=\"lease\"} stayed 0 on the cut gateway")
	}
	if rep.Failed != 0 {
		t.Errorf("%d calls failed otherwise than 503 (transport error, cut stream, other status)", rep.Failed)
	}
}

// answeredSince counts the calls answered 200 that started after since, on
// gateway gw (-1: any).
func answeredSince(l *agentLoad, since time.Time, gw int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.calls {
		if c.status == 200 && c.start.After(since) && (gw < 0 || c.gw == gw) {
			n++
		}
	}
	return n
}
