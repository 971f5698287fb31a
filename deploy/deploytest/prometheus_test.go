package deploytest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/capture/spool"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/gateway/seqstore"
	"github.com/rollgate/rollgate/internal/metrics"
)

// rateInterval stands in for Grafana's $__rate_interval (at least four
// scrape intervals of the 1s scrape used here).
const rateInterval = "10s"

// TestPrometheusEvaluatesDeployQueries starts a real gateway under load and a
// real Prometheus scraping it with the rule files loaded, then evaluates every
// dashboard panel query, the dashboard's variable query, every recording and
// alert rule through Prometheus's HTTP API.
func TestPrometheusEvaluatesDeployQueries(t *testing.T) {
	promBin := tool(t, "prometheus")
	dir := deployDir(t)
	panels := dashboardQueries(t, filepath.Join(dir, "grafana", "dashboards"))
	alerts, records := ruleExprs(t, filepath.Join(dir, "prometheus", "rules"))

	gw := startLoadedGateway(t)
	prom := startPrometheus(t, promBin, gw, filepath.Join(dir, "prometheus", "rules"))

	// Two scrapes with data first.
	prom.waitFor(t, "two scrapes of the gateway", func() (bool, string) {
		v, err := prom.instant(`count_over_time(up{job="rollgate"}[1m])`)
		if err != nil {
			return false, err.Error()
		}
		return len(v) == 1 && v[0].value() >= 2, fmt.Sprint(v)
	})

	// Every metric name the dashboards and rules use is exposed by rollgate.
	t.Run("metric names exist", func(t *testing.T) {
		names := map[string]bool{}
		for _, q := range panels {
			for _, n := range metricNames(q.expr) {
				names[n] = true
			}
		}
		for _, r := range append(alerts, records...) {
			for _, n := range metricNames(r.expr) {
				names[n] = true
			}
		}
		if len(names) < 15 {
			t.Fatalf("only %d metric names found in the queries: %v", len(names), names)
		}
		for n := range names {
			prom.waitFor(t, "series of "+n, func() (bool, string) {
				v, err := prom.instant(`count({__name__="` + n + `"})`)
				if err != nil {
					return false, err.Error()
				}
				return len(v) == 1 && v[0].value() > 0, "no series"
			})
		}
	})

	// Every panel query parses and returns data over the last 30 s, as
	// Grafana would ask for it.
	t.Run("dashboard panels", func(t *testing.T) {
		if len(panels) < 30 {
			t.Fatalf("%d panel queries, want every panel's", len(panels))
		}
		for _, q := range panels {
			prom.waitFor(t, fmt.Sprintf("panel %q query %s", q.panel, q.expr), func() (bool, string) {
				var n int
				var err error
				if q.instant {
					var v []sample
					v, err = prom.instant(q.expr)
					n = len(v)
				} else {
					n, err = prom.rangeQuery(q.expr, 30*time.Second)
				}
				if err != nil {
					return false, err.Error()
				}
				return n > 0, "no data"
			})
		}
	})

	t.Run("dashboard variable", func(t *testing.T) {
		// label_values(rollgate_requests_total, model)
		var models []string
		if err := prom.get("/api/v1/label/model/values", url.Values{"match[]": {"rollgate_requests_total"}}, &models); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"m", "noids", "dead"} {
			if !slices.Contains(models, want) {
				t.Errorf("model variable values %v lack %q", models, want)
			}
		}
	})

	// Prometheus loaded both rule files, evaluated every rule without error,
	// and every recording rule produced series.
	t.Run("rules evaluate", func(t *testing.T) {
		prom.waitFor(t, "every rule evaluated", func() (bool, string) {
			rules, err := prom.rules()
			if err != nil {
				return false, err.Error()
			}
			if len(rules) != len(alerts)+len(records) {
				return false, fmt.Sprintf("%d rules loaded, want %d", len(rules), len(alerts)+len(records))
			}
			for _, r := range rules {
				if r.Health != "ok" || r.LastError != "" {
					return false, fmt.Sprintf("rule %s: health %q error %q", r.Name, r.Health, r.LastError)
				}
			}
			return true, ""
		})
		for _, r := range records {
			prom.waitFor(t, "recording rule "+r.name, func() (bool, string) {
				v, err := prom.instant(r.name)
				if err != nil {
					return false, err.Error()
				}
				return len(v) > 0, "no series"
			})
		}
	})

	// Every alert expression parses and evaluates; the load (a dead, a hung
	// and an id-less backend, a failing sink and a failing spooled sink)
	// makes these return data (not RollgateDown, RollgateCaptureDropping,
	// RollgateCaptureQueueFilling, RollgateExportLag, RollgateSpoolCorruptRecords,
	// RollgateSequenceStoreUnavailable, RollgateSequenceLeaseLapsed: the
	// promtool tests make those fire).
	t.Run("alert expressions", func(t *testing.T) {
		withData := []string{"RollgateBackendDown", "RollgateBackendStalled", "RollgateBackendUnhealthy", "RollgateHighErrorRate",
			"RollgateExportErrors", "RollgateExportDroppingRows", "RollgateCallsWithoutTokenIDs",
			"RollgateTokenIDsNotFromEngine", "RollgateSpoolFilling", "RollgateSpoolDroppingRows", "RollgateExportBacklog"}
		if len(alerts) != 18 {
			t.Fatalf("%d alert rules, want 18", len(alerts))
		}
		for _, a := range alerts {
			if _, err := prom.instant(a.expr); err != nil {
				t.Errorf("alert %s: %v", a.name, err)
				continue
			}
			if !slices.Contains(withData, a.name) {
				continue
			}
			prom.waitFor(t, "alert "+a.name+" returning data", func() (bool, string) {
				v, err := prom.instant(a.expr)
				if err != nil {
					return false, err.Error()
				}
				return len(v) > 0, "no data"
			})
		}
		// The same alerts are pending or firing in Prometheus itself.
		prom.waitFor(t, "alerts active", func() (bool, string) {
			var res struct {
				Alerts []struct {
					Labels map[string]string `json:"labels"`
					State  string            `json:"state"`
				} `json:"alerts"`
			}
			if err := prom.get("/api/v1/alerts", nil, &res); err != nil {
				return false, err.Error()
			}
			active := map[string]bool{}
			for _, a := range res.Alerts {
				active[a.Labels["alertname"]] = true
			}
			for _, n := range withData {
				if !active[n] {
					return false, fmt.Sprintf("%s not active (active: %v)", n, active)
				}
			}
			return true, ""
		})
	})
}

// panelQuery is one target of a dashboard panel, with Grafana's variables
// replaced.
type panelQuery struct {
	panel   string
	expr    string
	instant bool
}

// dashboardQueries reads every dashboard JSON file and returns its targets.
func dashboardQueries(t *testing.T, dir string) []panelQuery {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in %s (%v)", dir, err)
	}
	type target struct {
		Expr    string `json:"expr"`
		Instant bool   `json:"instant"`
	}
	type panel struct {
		ID      int             `json:"id"`
		Type    string          `json:"type"`
		Title   string          `json:"title"`
		Targets []target        `json:"targets"`
		Panels  []panel         `json:"panels"`
		DS      json.RawMessage `json:"datasource"`
	}
	var out []panelQuery
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			UID        string  `json:"uid"`
			Panels     []panel `json:"panels"`
			Templating struct {
				List []struct {
					Name string `json:"name"`
				} `json:"list"`
			} `json:"templating"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		vars := map[string]string{"__rate_interval": rateInterval}
		for _, v := range d.Templating.List {
			switch v.Name {
			case "model":
				vars["model"] = ".*"
			case "datasource":
			default:
				t.Fatalf("%s: variable %q: the test does not know a value for it", f, v.Name)
			}
		}
		ids := map[int]bool{}
		var walk func(ps []panel)
		walk = func(ps []panel) {
			for _, p := range ps {
				if ids[p.ID] {
					t.Errorf("%s: duplicate panel id %d", f, p.ID)
				}
				ids[p.ID] = true
				walk(p.Panels)
				if p.Type == "row" {
					continue
				}
				if !bytes.Contains(p.DS, []byte(`"${datasource}"`)) {
					t.Errorf("%s: panel %q does not use the ${datasource} variable", f, p.Title)
				}
				if len(p.Targets) == 0 {
					t.Errorf("%s: panel %q has no query", f, p.Title)
				}
				for _, tg := range p.Targets {
					e := tg.Expr
					for k, v := range vars {
						e = strings.ReplaceAll(e, "$"+k, v)
					}
					if strings.Contains(e, "$") {
						t.Errorf("%s: panel %q: unknown variable in %s", f, p.Title, tg.Expr)
					}
					out = append(out, panelQuery{panel: p.Title, expr: e, instant: tg.Instant})
				}
			}
		}
		walk(d.Panels)
	}
	return out
}

// rule is an alert or recording rule from a rule file.
type rule struct {
	name string
	expr string
}

// ruleExprs reads the alert and recording rules from the rule files.
func ruleExprs(t *testing.T, dir string) (alerts, records []rule) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.yml"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var rf struct {
			Groups []struct {
				Rules []struct {
					Alert  string `yaml:"alert"`
					Record string `yaml:"record"`
					Expr   string `yaml:"expr"`
				} `yaml:"rules"`
			} `yaml:"groups"`
		}
		if err := yaml.Unmarshal(b, &rf); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				if r.Alert != "" {
					alerts = append(alerts, rule{r.Alert, r.Expr})
				} else {
					records = append(records, rule{r.Record, r.Expr})
				}
			}
		}
	}
	if len(alerts) == 0 || len(records) == 0 {
		t.Fatalf("rules in %s: %d alerts, %d records", dir, len(alerts), len(records))
	}
	return alerts, records
}

var metricNameRE = regexp.MustCompile(`\b(rollgate_[a-z_]+|process_[a-z_]+|go_[a-z_]+|up)\b[{\[ )]`)

// metricNames lists the raw metric names a PromQL expression selects
// (recording rule names, which contain ':', are not included).
func metricNames(expr string) []string {
	var out []string
	for _, m := range metricNameRE.FindAllStringSubmatch(expr+" ", -1) {
		out = append(out, m[1])
	}
	return out
}

// failingSink refuses every batch, as a broken export target would.
type failingSink struct{}

func (failingSink) Write(context.Context, *export.Batch) error {
	return errors.New("deploytest: sink refuses every batch")
}

// startLoadedGateway starts mock engines, a dead and a hung backend, a
// gateway in front of them with the SQLite store plus a failing sink, and a
// load generator that runs until the test ends. It returns the gateway's
// host:port.
func startLoadedGateway(t *testing.T) string {
	t.Helper()
	ms, base, err := mock.Start(mock.Config{MaxTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Shutdown() })
	noIDs, noIDsBase, err := mock.Start(mock.Config{MaxTokens: 8, IgnoreReturnTokenIDs: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { noIDs.Shutdown() })

	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + dead.Addr().String() + "/v1"
	dead.Close() // connection refused from now on

	store, err := sqlite.Open(filepath.Join(t.TempDir(), "rollgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	m := metrics.New()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil)) // the failing sink logs every batch
	// "broken" fails every write (export errors, dropped rows); "spooled" is
	// a failing sink behind a small durable spool that fills and drops.
	sp, err := spool.New(spool.Config{Dir: filepath.Join(t.TempDir(), "spool"), MaxBytes: 256 << 10, FullPolicy: spool.Drop},
		failingSink{}, "spooled", m.Registry, quiet)
	if err != nil {
		t.Fatal(err)
	}
	pipe := capture.NewPipeline(capture.Config{FlushInterval: 50 * time.Millisecond, BatchSize: 256, Retries: 1},
		[]capture.NamedSink{{Name: store.Name(), Sink: store}, {Name: "broken", Sink: failingSink{}}, {Name: "spooled", Sink: sp}}, m, quiet)

	// hung accepts connections and never answers.
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var hungMu sync.Mutex
	var hungConns []net.Conn
	go func() {
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			hungMu.Lock()
			hungConns = append(hungConns, c)
			hungMu.Unlock()
		}
	}()

	// The sequence store's metrics on the gateway's registry, as serve
	// registers them (the rules use them).
	seqs, err := seqstore.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "sequences.db"), seqstore.Options{Registerer: m.Registry})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seqs.Close() })

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{
		Listen:          ln.Addr().String(),
		UpstreamTimeout: 10 * time.Minute,
		IdleTimeout:     10 * time.Minute, // the hung backend stays hung for the whole test
		Retries:         -1,
		SequenceStore:   seqs,
		Backends: []gateway.Backend{
			{Model: "m", Replicas: []gateway.Replica{{Name: "mock-a", URL: base, Kind: "vllm", PolicyVersion: "v1"}}},
			{Model: "noids", Replicas: []gateway.Replica{{Name: "mock-noids", URL: noIDsBase, Kind: "vllm"}}},
			{Model: "dead", Replicas: []gateway.Replica{{Name: "dead-1", URL: deadURL, Kind: "vllm"}}},
			{Model: "hung", Replicas: []gateway.Replica{{Name: "hung-1", URL: "http://" + hung.Addr().String() + "/v1", Kind: "vllm"}}},
		},
	}, pipe, m, quiet)
	if err != nil {
		t.Fatal(err)
	}
	go gw.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		gw.Shutdown(ctx)
		pipe.Close(ctx)
		sp.Close(ctx)
	})

	// Load: runs until the test's cleanup (registered last, so it runs first).
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	gwURL := "http://" + ln.Addr().String()
	send := func(path, body string) {
		req, err := http.NewRequestWithContext(ctx, "POST", gwURL+path, strings.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	chat := func(model string, stream bool) string {
		return fmt.Sprintf(`{"model":%q,"stream":%t,"messages":[{"role":"user","content":"hello there"}]}`, model, stream)
	}
	for range 2 { // two calls stuck on the hung backend for the whole test
		wg.Add(1)
		go func() { defer wg.Done(); send("/v1/chat/completions", chat("hung", false)) }()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			rollout := fmt.Sprintf("/rollout/r-%d/attempt/a-1", i%5)
			send(rollout+"/v1/chat/completions", chat("m", true))
			send(rollout+"/v1/chat/completions", chat("m", false))
			send("/v1/completions", `{"model":"m","prompt":"once upon","max_tokens":4}`)
			send("/v1/embeddings", `{"model":"m","input":"embed me"}`)
			send("/v1/chat/completions", chat("noids", true))
			send("/v1/chat/completions", chat("dead", false))
			send("/rollout/bad%20id/attempt/a-1/v1/chat/completions", chat("m", false)) // refused: invalid_id
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond): // the load's pace between rounds, not a wait
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		hung.Close()
		hungMu.Lock()
		for _, c := range hungConns {
			c.Close()
		}
		hungMu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// prometheus is a running Prometheus server.
type prometheus struct {
	base string
	log  *bytes.Buffer
}

// startPrometheus runs the real Prometheus on loopback, scraping target every
// second as job "rollgate", with deploy's rule files loaded (their group
// intervals shortened to 1s so that rules evaluate during the test).
func startPrometheus(t *testing.T, bin, target, rulesDir string) *prometheus {
	t.Helper()
	tmp := t.TempDir()
	rules, _ := filepath.Glob(filepath.Join(rulesDir, "*.yml"))
	var ruleFiles []string
	for _, f := range rules {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b = regexp.MustCompile(`(?m)^(\s+interval:) \S+$`).ReplaceAll(b, []byte("$1 1s"))
		dst := filepath.Join(tmp, filepath.Base(f))
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
		ruleFiles = append(ruleFiles, dst)
	}
	cfg := map[string]any{
		"global":     map[string]any{"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
		"rule_files": ruleFiles,
		"scrape_configs": []any{map[string]any{
			"job_name":       "rollgate",
			"static_configs": []any{map[string]any{"targets": []string{target}}},
		}},
	}
	cb, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(tmp, "prometheus.yml")
	if err := os.WriteFile(cfgPath, cb, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	p := &prometheus{base: "http://" + addr, log: new(bytes.Buffer)}
	cmd := exec.Command(bin,
		"--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(tmp, "data"),
		"--web.listen-address="+addr,
		"--web.console.templates="+filepath.Join(tmp, "none"),
		"--web.console.libraries="+filepath.Join(tmp, "none"),
		"--log.level=warn")
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting prometheus: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("prometheus log:\n%s", p.log)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := http.Get(p.base + "/-/ready")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return p
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("prometheus exited: %v\n%s", err, p.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 30s\n%s", p.log)
		}
		time.Sleep(100 * time.Millisecond) // polling interval of this wait on /-/ready
	}
}

// waitFor polls cond until it holds; after 45 s it fails with cond's last
// explanation. The deadline only bounds a broken run: on a working one the
// condition holds within a few scrapes.
func (p *prometheus) waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: %s", what, why)
			return
		}
		time.Sleep(250 * time.Millisecond) // polling interval: cond is the condition
	}
}

// get calls a Prometheus API endpoint and decodes its "data" into out. A
// query that does not parse comes back as an error.
func (p *prometheus) get(path string, q url.Values, out any) error {
	u := p.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	res, err := http.Get(u)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer res.Body.Close()
	var env struct {
		Status    string          `json:"status"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
		Data      json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(res.Body).Decode(&env); err != nil {
		return fmt.Errorf("GET %s: decoding: %w", path, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("GET %s: %s: %s", u, env.ErrorType, env.Error)
	}
	return json.Unmarshal(env.Data, out)
}

// sample is one element of an instant vector.
type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s sample) value() float64 {
	var f float64
	fmt.Sscan(fmt.Sprint(s.Value[1]), &f)
	return f
}

// instant evaluates expr now; scalars come back as one sample.
func (p *prometheus) instant(expr string) ([]sample, error) {
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.get("/api/v1/query", url.Values{"query": {expr}}, &d); err != nil {
		return nil, err
	}
	if d.ResultType == "scalar" {
		var v [2]any
		err := json.Unmarshal(d.Result, &v)
		return []sample{{Value: v}}, err
	}
	var v []sample
	err := json.Unmarshal(d.Result, &v)
	return v, err
}

// rangeQuery evaluates expr over the last span with a 1s step, as a
// dashboard does, and returns the number of series.
func (p *prometheus) rangeQuery(expr string, span time.Duration) (int, error) {
	now := time.Now()
	var d struct {
		Result []json.RawMessage `json:"result"`
	}
	err := p.get("/api/v1/query_range", url.Values{
		"query": {expr}, "start": {fmt.Sprint(now.Add(-span).Unix())}, "end": {fmt.Sprint(now.Unix())}, "step": {"1"},
	}, &d)
	return len(d.Result), err
}

// loadedRule is a rule as /api/v1/rules reports it.
type loadedRule struct {
	Name      string `json:"name"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
	Type      string `json:"type"`
}

// rules returns every loaded rule with its health ("unknown" until first evaluated).
func (p *prometheus) rules() ([]loadedRule, error) {
	var d struct {
		Groups []struct {
			Rules []loadedRule `json:"rules"`
		} `json:"groups"`
	}
	if err := p.get("/api/v1/rules", nil, &d); err != nil {
		return nil, err
	}
	var out []loadedRule
	for _, g := range d.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}
