package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rollgate/rollgate/bench/load"
	"github.com/rollgate/rollgate/export/stores"
)

const benchSummary = `rollgate bench — generate load and check the capture.

  rollgate bench --url http://127.0.0.1:8000 --agents 64 --turns 4 --duration 10s --stream --db ./rollgate.db
  rollgate bench --url http://127.0.0.1:8001 --paths plain --mode open --rate 500 --duration 10s
  rollgate bench table [--baseline direct] results.jsonl ...   (markdown table of --json runs)

Closed loop (default): --agents agents each run rollouts of --turns calls (every --tool-every-th
turn offers a tool; the engine calls it and the next turn sends its result), one rollout after
another, until --rollouts rollouts or --duration. Open loop: calls start at --rate per second
whatever the answers take; latency counts from the scheduled start. Calls go to
URL/rollout/{id}/attempt/1/v1/chat/completions (--paths rollout, rollgate's per-rollout base
URLs) or URL/v1/chat/completions (--paths plain, for engines and plain proxies).

With --db or --clickhouse, the store is read after the run: every call the client saw (by its
x-request-id) must be there exactly once with token_source=engine and as many response token
ids as completion_tokens; missing and duplicate rows are counted, and the exit status is 1 if
any check fails. --pids reports CPU seconds (from /proc/PID/stat, descendants included) used
during the run, peak RSS (VmHWM) of the server processes, and their resident set (VmRSS) just
before the run and at most during it (sampled every 50 ms). --idle N holds N idle keep-alive
connections open through the warm-up and the run (each makes one GET first), the load of agents
waiting on long tools; the exit status is 1 if the server closed any.`

func runBench(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "table" {
		return runBenchTable(args[1:], stdout, stderr)
	}
	fs := newFlagSet("bench", benchSummary, stdout)
	var cfg load.Config
	var headers headerFlag
	fs.StringVar(&cfg.BaseURL, "url", "http://127.0.0.1:8000", "server root URL (without /v1)")
	fs.StringVar(&cfg.PathStyle, "paths", load.PathRollout, "rollout (URL/rollout/{id}/attempt/1/v1/...) or plain (URL/v1/...)")
	fs.StringVar(&cfg.Mode, "mode", load.ModeClosed, "closed (agents) or open (fixed rate)")
	fs.IntVar(&cfg.Agents, "agents", 4, "closed loop: concurrent agents")
	fs.IntVar(&cfg.Turns, "turns", 3, "closed loop: calls per rollout")
	fs.IntVar(&cfg.Rollouts, "rollouts", 0, "closed loop: stop after this many rollouts (0 = until --duration)")
	fs.DurationVar(&cfg.Duration, "duration", 0, "stop starting calls after this long (0 = until --rollouts / --requests)")
	fs.Float64Var(&cfg.Rate, "rate", 100, "open loop: calls per second")
	fs.IntVar(&cfg.Requests, "requests", 0, "open loop: stop after this many calls (0 = until --duration)")
	fs.IntVar(&cfg.OpenTurns, "open-turns", 1, "open loop: consecutive calls that share a rollout (1 = every call starts a rollout and reserves its sequence ids)")
	fs.IntVar(&cfg.MaxInFlight, "max-in-flight", 4096, "open loop: calls in flight beyond this are counted as errors, not sent")
	fs.BoolVar(&cfg.Stream, "stream", false, "streaming calls")
	fs.BoolVar(&cfg.IncludeUsage, "include-usage", false, "ask for the usage chunk of streams")
	fs.BoolVar(&cfg.Logprobs, "logprobs", false, "ask for the sampled tokens' logprobs (\"logprobs\": true), as rollgate asks the engine by default (--inject-logprobs)")
	fs.BoolVar(&cfg.ReturnTokenIDs, "return-token-ids", false, "ask the engine for token ids (return_token_ids), as rollgate does: with --include-usage, a direct run that makes the engine do rollgate's work")
	fs.IntVar(&cfg.ToolEvery, "tool-every", 3, "offer a tool every k-th turn (0 = never)")
	fs.IntVar(&cfg.SystemBytes, "system-bytes", 0, "pad each rollout's system message to about this many bytes (long contexts: the cost of request size); 0 = a one-line instruction")
	fs.DurationVar(&cfg.ThinkTime, "think-time", 0, "closed loop: wait this long after an answer before the rollout's next turn (the environment's step: a tool, a test run), e.g. 20ms; 0 = none")
	fs.IntVar(&cfg.ContextBytes, "context-bytes", 0, "add about this many bytes of the rollout's own text (a task, an observation) to its first user message, resent every turn (what a replica's prefix cache keeps for the rollout; see --system-bytes for text shared by all rollouts); 0 = none")
	fs.IntVar(&cfg.MaxTokens, "max-tokens", 0, "max_tokens of each call (0 = not sent)")
	fs.StringVar(&cfg.Model, "model", "mock-model", "model of each call")
	fs.Var(&headers, "header", `extra request header "Name: value" (repeatable)`)
	fs.StringVar(&cfg.RunID, "run-id", "", "prefix of rollout ids (default random)")
	fs.DurationVar(&cfg.Timeout, "timeout", time.Minute, "longest one call may take")
	warmup := fs.Duration("warmup", 0, "run the same load this long first, unmeasured")
	dbPath := fs.String("db", "", "after the run, check the capture in this embedded SQLite store")
	clickhouseDSN := fs.String("clickhouse", "", "after the run, check the capture in this ClickHouse (DSN)")
	verifyWait := fs.Duration("verify-wait", 30*time.Second, "how long to wait for the capture to catch up")
	pidList := fs.String("pids", "", "comma-separated server process ids whose CPU and peak RSS to report")
	label := fs.String("label", "", "name of the target in --json output (e.g. direct, rollgate-sqlite)")
	scenario := fs.String("scenario", "", "name of the load in --json output (default from the flags)")
	jsonOut := fs.String("json", "", "append the report as one JSON line to this file")
	idle := fs.Int("idle", 0, "hold this many idle keep-alive connections open during the warm-up and the run, each after one GET of --idle-path (agents waiting on a long tool); the run fails if the server closes any")
	idlePath := fs.String("idle-path", "/v1/models", "the path each idle connection GETs (below --url) before going idle")
	_, err := parseWithEnv(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "rollgate bench:", err)
		return 2
	}
	cfg.Header = http.Header(headers)
	pids, err := parsePIDs(*pidList)
	if err != nil {
		fmt.Fprintln(stderr, "rollgate bench:", err)
		return 2
	}

	if *idle < 0 {
		fmt.Fprintln(stderr, "rollgate bench: --idle must be 0 or more")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var bareRSS float64
	if len(pids) > 0 && *idle > 0 {
		if bareRSS, err = load.RSS(pids); err != nil {
			fmt.Fprintln(stderr, "rollgate bench:", err)
			return 1
		}
	}
	var idlers *load.IdleConns
	if *idle > 0 {
		if idlers, err = load.OpenIdle(ctx, cfg.BaseURL, *idlePath, *idle); err != nil {
			fmt.Fprintln(stderr, "rollgate bench:", err)
			return 1
		}
		defer idlers.Close()
	}
	var idleRSS float64
	if len(pids) > 0 && *idle > 0 {
		if idleRSS, err = load.RSS(pids); err != nil {
			fmt.Fprintln(stderr, "rollgate bench:", err)
			return 1
		}
	}
	if *warmup > 0 {
		w := cfg
		w.Duration, w.Rollouts, w.Requests = *warmup, 0, 0
		w.RunID = cfg.RunID
		if w.RunID != "" {
			w.RunID += "-warmup"
		}
		if _, err := load.Run(ctx, w); err != nil {
			fmt.Fprintln(stderr, "rollgate bench: warm-up:", err)
			return 2
		}
	}
	var (
		snap     *load.ProcSnapshot
		sampler  *load.RSSSampler
		startRSS float64
	)
	if len(pids) > 0 {
		if snap, err = load.Snapshot(pids); err != nil {
			fmt.Fprintln(stderr, "rollgate bench:", err)
			return 1
		}
		if startRSS, err = load.RSS(pids); err != nil {
			fmt.Fprintln(stderr, "rollgate bench:", err)
			return 1
		}
		sampler = load.SampleRSS(pids, 50*time.Millisecond)
	}
	res, err := load.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "rollgate bench:", err)
		return 2
	}
	rep := res.Summary()
	if snap != nil {
		runRSS, rerr := sampler.Stop()
		if rep.Proc, err = snap.Since(rep.OK); err != nil || rerr != nil {
			fmt.Fprintln(stderr, "rollgate bench:", cmp.Or(err, rerr))
			return 1
		}
		rep.Proc.StartRSSMiB, rep.Proc.RunRSSMiB, rep.Proc.BareRSSMiB, rep.Proc.IdleRSSMiB = startRSS, runRSS, bareRSS, idleRSS
	}
	code := 0
	if *idle > 0 {
		rep.Idle, rep.IdleOpen = idlers.Len(), idlers.StillOpen()
		if rep.IdleOpen < rep.Idle {
			fmt.Fprintf(stderr, "rollgate bench: the server closed %d of the %d idle connections during the run\n", rep.Idle-rep.IdleOpen, rep.Idle)
			code = 1
		}
	}
	rep.Label = *label
	rep.Scenario = *scenario
	if rep.Scenario == "" {
		rep.Scenario = defaultScenario(&res.Config)
	}
	if *dbPath != "" || *clickhouseDSN != "" {
		store, err := stores.Open(ctx, *clickhouseDSN, *dbPath)
		if err != nil {
			fmt.Fprintln(stderr, "rollgate bench: opening store:", err)
			return 1
		}
		rep.Capture, err = load.Verify(ctx, store, res, *verifyWait)
		store.Close()
		if err != nil {
			fmt.Fprintln(stderr, "rollgate bench:", err)
			return 1
		}
		if !rep.Capture.OK() {
			code = 1
		}
	}
	if *label != "" {
		fmt.Fprintf(stdout, "%s: ", *label)
	}
	rep.Print(stdout)
	if *jsonOut != "" {
		if err := appendJSON(*jsonOut, rep); err != nil {
			fmt.Fprintln(stderr, "rollgate bench:", err)
			return 1
		}
	}
	return code
}

func runBenchTable(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("bench table", "rollgate bench table [--baseline LABEL] FILE... — markdown table of rollgate bench --json reports, medians over runs, against the baseline label", stdout)
	baseline := fs.String("baseline", "direct", "label the others are compared with")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "rollgate bench table:", flagError(fs, err))
		return 2
	}
	var reps []*load.Report
	for _, name := range fs.Args() {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintln(stderr, "rollgate bench table:", err)
			return 1
		}
		r, err := load.ReadReports(f)
		f.Close()
		if err != nil {
			fmt.Fprintf(stderr, "rollgate bench table: %s: %v\n", name, err)
			return 1
		}
		reps = append(reps, r...)
	}
	if len(reps) == 0 {
		fmt.Fprintln(stderr, "rollgate bench table: no reports given")
		return 2
	}
	load.Table(stdout, reps, *baseline)
	return 0
}

func defaultScenario(c *load.Config) string {
	kind := "json"
	if c.Stream {
		kind = "sse"
	}
	if c.Mode == load.ModeOpen {
		if c.OpenTurns > 1 {
			return fmt.Sprintf("open %s %.0f/s %d/rollout", kind, c.Rate, c.OpenTurns)
		}
		return fmt.Sprintf("open %s %.0f/s", kind, c.Rate)
	}
	return fmt.Sprintf("%s %dx%d", kind, c.Agents, c.Turns)
}

func appendJSON(path string, rep *load.Report) error {
	b, err := json.Marshal(rep)
	if err != nil {
		return fmt.Errorf("encoding report: %w", err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("writing report: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("writing report to %s: %w", path, err)
	}
	return f.Close()
}

func parsePIDs(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--pids: %q is not a process id", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// headerFlag collects repeated --header "Name: value" flags.
type headerFlag http.Header

func (h *headerFlag) String() string { return "" }

func (h *headerFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(name) == "" {
		return fmt.Errorf("want \"Name: value\", got %q", v)
	}
	if *h == nil {
		*h = headerFlag{}
	}
	http.Header(*h).Add(strings.TrimSpace(name), strings.TrimSpace(value))
	return nil
}
