package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/controlplane"
	"github.com/rollgate/rollgate/controlplane/lease"
	taskqueue "github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/stores"
	bridge "github.com/rollgate/rollgate/trainer-bridge"
	"github.com/rollgate/rollgate/trainer-bridge/air"
	"github.com/rollgate/rollgate/trainer-bridge/credit"
)

const bridgeSummary = `rollgate bridge — turn captured calls and rewards into training samples.

  rollgate bridge --out batch.jsonl --estimator grpo
  rollgate bridge --mode trajectories --agent '^solver$' --status succeeded,failed --out batch.parquet

Selects rollout attempts (by default, per rollout, the latest attempt that succeeded or
failed, or that was never registered and has an episode reward: --status), groups them by
the rollouts' group_id, else by task (the x-task-id header of their calls; --group-by),
excludes and counts calls that
errored or lack verified token ids (with --retokenize, calls captured without ids get ids
from the model's chat template and tokenizer instead, marked token_source retokenized;
--retokenize-all does so to every call, to measure what retokenising changes),
adds automatic intermediate rewards (AIR) from rules over the captured calls, spreads
rewards over calls (credit), computes advantages per group and writes one sample
per line (JSONL), one per row (Parquet) or a padded batch with verl's tensor names
(safetensors), chosen by --format or the file extension.
With --serve, online trainers pull the samples instead: POST /lease {"n": N} hands out
the next N under a lease id, POST /ack {"lease_id": ...} consumes them, and a lease not
acknowledged within --lease-ttl returns its samples to the queue. As serve's /api/v1, it
needs Authorization: Bearer $ROLLGATE_ADMIN_TOKEN when that is set, and a non-loopback
--serve address needs the token (or --insecure-admin).
A summary (samples, groups, exclusions by reason, AIR hits, reward per task) goes to stderr;
whatever it leaves out is named with its reason and the flag or header that changes it.
Batch files are created with mode 0666 less the umask (0644 under the usual 022): they hold
prompts and answers as token ids, so set a stricter umask (077) to keep them private.`

func runBridge(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("bridge", bridgeSummary, stdout, bridgeSections...) // a new flag needs its line in bridgeSections
	clickhouseDSN := fs.String("clickhouse", "", "ClickHouse DSN (empty = embedded store)")
	dbPath := fs.String("db", defaultDB, "embedded SQLite store path, used when --clickhouse is empty")
	out := fs.String("out", "", "output file (required; '-' = stdout, JSONL only)")
	format := fs.String("format", "", "jsonl, parquet or safetensors (default: from the --out extension, else jsonl)")
	padID := fs.Int64("pad-id", 0, "padding token id of safetensors batches (default: the pad_token of --tokenizer-config, else 0)")
	tokenizerConfig := fs.String("tokenizer-config", "", "a Hugging Face tokenizer_config.json whose pad_token id pads safetensors batches when --pad-id is not given")
	padPrompt := fs.Int("pad-prompt", 0, "safetensors: pad prompts to this many tokens (0 = the longest prompt of the batch); a longer prompt is an error, never cut. Fixed lengths let batches concatenate (verl's prompt_length)")
	padResponse := fs.Int("pad-response", 0, "safetensors: pad responses to this many tokens (0 = the longest response); a longer response is an error, never cut (cut with --max-response). verl's response_length")
	batchMultiple := fs.Int("batch-multiple", 0, "safetensors: append padding rows (all pad ids, masks 0, padding true in the metadata) until the row count is a multiple of this (0 or 1 = off)")
	logprobsPolicy := fs.String("logprobs", "", "keep (default: write rollout_log_probs; samples without sampling logprobs are excluded as no_logprobs) or omit (leave rollout_log_probs out of the output, keep every sample); default omit with --retokenize")
	mode := fs.String("mode", bridge.ModeTransitions, "transitions or trajectories")
	rewardName := fs.String("reward-name", "primary", "name of the episode and per-call rewards")
	creditMode := fs.String("credit", string(credit.Identical), "credit assignment: identical, discounted, last")
	gamma := fs.Float64("gamma", 1, "discount for --credit discounted")
	estimator := fs.String("estimator", "grpo", "advantage: grpo, drgrpo, rloo, reinforce++-baseline, none")
	level := fs.String("level", bridge.LevelRollout, "advantage level: rollout (broadcast) or transition")
	dropZero := fs.Bool("drop-zero-variance", false, "drop groups whose scores are all equal")
	since := fs.String("since", "", "first call at or after this time (RFC 3339 or unix nanoseconds)")
	until := fs.String("until", "", "first call before this time (RFC 3339 or unix nanoseconds)")
	tasks := fs.String("tasks", "", "comma-separated task ids (empty = all)")
	status := fs.String("status", strings.Join(bridge.DefaultStatuses, ","), "comma-separated attempt statuses (empty = any, rewarded or not): succeeded, failed, cancelled, queued, running, or "+bridge.StatusUnregistered+" = rollouts never registered (calls on the per-rollout URL alone), selected once they have an episode reward, which marks their end (without one: unfinished). Failed attempts train with their reward (0 when none), as Agent Lightning does")
	missingReward := fs.String("missing-reward", bridge.MissingZero, "a selected attempt without an episode reward: 0 (reward 0, counted), drop (exclude it: no_reward) or drop-group (exclude its whole group: missing_reward_group)")
	groupBy := fs.String("group-by", bridge.GroupGroup, "advantage group (the trainer's uid): group (the rollout's group_id: one per task per enqueue call of POST /api/v1/tasks, or given to POST /api/v1/rollouts; rollouts without one as task+policy), task+policy (task and the policy version of the attempt's first call) or task")
	minGroup := fs.Int("min-group-size", 0, "exclude the samples of groups sampled with fewer members (small_group); 0 = 2 for grpo, drgrpo and rloo, 1 otherwise")
	agent := fs.String("agent", "", "regular expression on agent_name (empty = all agents)")
	minPV := fs.String("min-policy-version", "", "drop calls served by an older policy version")
	rolloutIDs := fs.String("rollouts", "", "comma-separated rollout ids (empty = all)")
	after := fs.Int64("after", -1, "only rollouts the task queue completed after this cursor (next_after of GET /api/v1/rollouts; 0 = from the start; -1 = off)")
	queueDSN := fs.String("queue", "", "task queue for --after: a SQLite path or postgres:// DSN (empty = the embedded SQLite file, --db)")
	attempts := fs.String("attempts", bridge.AttemptsLatest, "latest or all attempts per rollout")
	maxPrompt := fs.Int("max-prompt", 0, "maximum prompt tokens (0 = no limit)")
	maxResponse := fs.Int("max-response", 0, "maximum response tokens (0 = no limit)")
	truncation := fs.String("truncation", bridge.TruncCut, "over a limit: cut (a response is cut at --max-response and kept, marked truncated; a prompt over --max-prompt excludes the sample: prompt_too_long), drop (exclude the sample) or trim (off-policy: also keeps the last --max-prompt prompt tokens, a context the policy never saw)")
	spillDir := fs.String("spill-dir", "", "folder for the samples a streamed export (JSONL, Parquet, --explain) keeps on disk until the advantages are known, at most about 5 bytes per token (a prompt shared with the previous turn is stored once), removed at the end (default: the output's folder, else $TMPDIR)")
	quiet := fs.Bool("quiet", false, "no progress bar on a terminal: a progress line every 10 s instead, as when stderr is not a terminal")
	airOn := fs.Bool("air", true, "compute automatic intermediate rewards")
	airWrite := fs.Bool("air-write", false, "store AIR outcomes in the rewards table (source = rule name)")
	airRules := fs.String("air-rules", "", "comma-separated rule=weight or rule=off, e.g. air_truncated=-1,air_repeat=off (rules: "+strings.Join(air.RuleNames, ", ")+")")
	var airPatterns []string
	fs.Func("air-failure-pattern", "regular expression marking a failed tool result (repeatable; default: built-in patterns)", func(s string) error {
		if _, err := regexp.Compile(s); err != nil {
			return err
		}
		airPatterns = append(airPatterns, s)
		return nil
	})
	airMinRepeats := fs.Int("air-min-repeats", 2, "identical consecutive calls from which air_repeat hits")
	timeout := fs.Duration("timeout", time.Hour, "timeout of the selection and assembly")
	serve := fs.String("serve", "", "instead of writing a file, serve the samples to online trainers on this address (POST /lease, POST /ack, GET /counts) until all are acknowledged")
	leaseTTL := fs.Duration("lease-ttl", 5*time.Minute, "with --serve: an unacknowledged lease returns its samples to the queue after this long")
	insecureAdmin := fs.Bool("insecure-admin", false, "allow --serve on a non-loopback address without ROLLGATE_ADMIN_TOKEN: anyone who reaches the port can then lease and acknowledge (consume) every sample. With ROLLGATE_ADMIN_TOKEN set, every request of the lease API needs Authorization: Bearer <token>, as serve's /api/v1")
	retokenizeDir := fs.String("retokenize", "", "Hugging Face model folder (tokenizer.json, tokenizer_config.json, chat_template.jinja if shipped): calls captured without token ids (token_source none) get ids from its chat template and tokenizer, marked token_source retokenized, logprobs 0, never merged with engine ids by --mode trajectories (default off: such calls are excluded as unverified_ids). Its files must be regular files (symlinks to them are followed) of at most 64 MiB each; a device, FIFO or larger file is refused")
	retokenizeAll := fs.Bool("retokenize-all", false, "with --retokenize: rebuild the ids of every call from its text (chat template + tokenizer), even those captured with the engine's ids, and drop the engine's logprobs (token_source retokenized, logprobs omitted by default); for measuring what retokenising changes (examples/train-cpu/RETOKENIZE.md), not for training")
	reportPath := fs.String("report", "", "write a JSON report to this file: every selected attempt, its calls and samples, included or excluded with the reason")
	explain := fs.String("explain", "", "print what became of this rollout's attempts, calls and samples and why (with the selection and options given; --out is then optional)")
	setFlags, err := parseWithEnv(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "rollgate bridge: "+format+"\n", a...)
		return code
	}
	if err != nil {
		return fail(2, "%v", err)
	}
	if *out == "" && *serve == "" && *explain == "" {
		return fail(2, "--out (or --serve, or --explain) is required")
	}
	adminToken := os.Getenv("ROLLGATE_ADMIN_TOKEN")
	if *serve != "" {
		if err := requireAdminOffLoopback(adminToken, *insecureAdmin,
			"lease and acknowledge (consume) every sample of the batch",
			"Set ROLLGATE_ADMIN_TOKEN (trainers then send Authorization: Bearer <token>)",
			listenFlag{"--serve", *serve}); err != nil {
			return fail(2, "%v", err)
		}
	}
	if *format == "" {
		*format = "jsonl"
		switch {
		case strings.HasSuffix(*out, ".parquet"):
			*format = "parquet"
		case strings.HasSuffix(*out, ".safetensors"):
			*format = "safetensors"
		}
	}
	if *format != "jsonl" && *format != "parquet" && *format != "safetensors" {
		return fail(2, "--format %q is not jsonl, parquet or safetensors", *format)
	}
	if *format != "jsonl" && *out == "-" && *serve == "" {
		return fail(2, "%s output needs a file", *format)
	}
	to, err := tensorOptions(setFlags, *format, *serve != "", *padID, *tokenizerConfig, *padPrompt, *padResponse, *batchMultiple)
	if err != nil {
		return fail(2, "%v", err)
	}
	// The flags fill one bridge.Request, as the HTTP API's JSON body does.
	req := bridge.Request{Tasks: splitList(*tasks), RolloutIDs: splitList(*rolloutIDs), Statuses: splitList(*status),
		Agent: *agent, MinPolicyVersion: *minPV, Attempts: *attempts, Mode: *mode, RewardName: *rewardName,
		Credit: *creditMode, Gamma: gamma, Estimator: *estimator, Level: *level, DropZeroVariance: *dropZero,
		MaxPrompt: *maxPrompt, MaxResponse: *maxResponse, Truncation: *truncation, MissingReward: *missingReward,
		MinGroupSize: *minGroup, GroupBy: *groupBy, Logprobs: *logprobsPolicy, AIR: airOn, AIRRules: splitList(*airRules),
		AIRFailurePatterns: airPatterns, AIRMinRepeats: *airMinRepeats, WriteAIR: *airWrite, Retokenize: *retokenizeDir,
		RetokenizeAll: *retokenizeAll}
	if req.Statuses == nil {
		req.Statuses = []string{} // --status "": any status
	}
	sinceT, err := parseTime(*since)
	if err != nil {
		return fail(2, "--since: %v", err)
	}
	untilT, err := parseTime(*until)
	if err != nil {
		return fail(2, "--until: %v", err)
	}
	if !sinceT.IsZero() {
		req.SinceUnixNano = sinceT.UnixNano()
	}
	if !untilT.IsZero() {
		req.UntilUnixNano = untilT.UnixNano()
	}
	o, err := req.Options()
	if err != nil {
		return fail(2, "%v", err)
	}
	tty := false
	if f, ok := stderr.(*os.File); ok && !*quiet {
		tty = isTerminal(f)
	}
	o.Progress = newProgressReporter(stderr, tty).update
	o.SpillDir = *spillDir
	if o.SpillDir == "" && *out != "" && *out != "-" {
		o.SpillDir = filepath.Dir(*out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	store, err := stores.Open(ctx, *clickhouseDSN, *dbPath)
	if err != nil {
		return fail(1, "opening store: %v", err)
	}
	defer store.Close()
	if *after >= 0 {
		ids, next, err := completedAfter(ctx, *queueDSN, *dbPath, *after)
		if err != nil {
			return fail(1, "%v", err)
		}
		fmt.Fprintf(stderr, "rollgate bridge: %d rollouts completed after cursor %d; next cursor %d (pass --after %d next time)\n", len(ids), *after, next, next)
		if len(ids) == 0 {
			return 0
		}
		if len(o.Selection.RolloutIDs) > 0 {
			keep := map[string]bool{}
			for _, id := range o.Selection.RolloutIDs {
				keep[id] = true
			}
			var both []string
			for _, id := range ids {
				if keep[id] {
					both = append(both, id)
				}
			}
			if len(both) == 0 {
				return 0
			}
			ids = both
		}
		o.Selection.RolloutIDs = ids
	}
	o.Report = *reportPath != "" || *explain != ""
	if *out == "" && *serve == "" {
		// --explain alone: build (streamed, nothing kept) and explain.
		o.Emit = func(*bridge.Sample) error { return nil }
		res, err := bridge.Build(ctx, store, o)
		if err != nil {
			return fail(optionStatus(err), "%v", err)
		}
		if err := writeReport(*reportPath, *explain, res, stdout); err != nil {
			return fail(1, "%v", err)
		}
		printSummary(stderr, &res.Stats, "(no output)")
		return 0
	}
	if *serve == "" && *format != "safetensors" {
		// JSONL and Parquet are streamed: memory stays bounded by one
		// attempt however many samples the export has.
		res, err := streamSamples(ctx, store, o, *out, *format, stdout)
		if err != nil {
			return fail(optionStatus(err), "%v", err)
		}
		explainTo := stdout
		if *out == "-" {
			explainTo = stderr // stdout carries the samples
		}
		if err := writeReport(*reportPath, *explain, res, explainTo); err != nil {
			return fail(1, "%v", err)
		}
		printSummary(stderr, &res.Stats, *out)
		return 0
	}
	res, err := bridge.Build(ctx, store, o)
	if err != nil {
		return fail(optionStatus(err), "%v", err)
	}
	explainTo := stdout
	if *out == "-" {
		explainTo = stderr
	}
	if err := writeReport(*reportPath, *explain, res, explainTo); err != nil {
		return fail(1, "%v", err)
	}
	if *serve != "" {
		printSummary(stderr, &res.Stats, "http://"+*serve)
		if err := serveSamples(*serve, *leaseTTL, adminToken, res.Samples, stderr); err != nil {
			return fail(1, "%v", err)
		}
		return 0
	}
	to.OmitLogprobs = omitLogprobs(o)
	ts, err := writeSamples(*out, *format, to, stdout, res.Samples)
	if err != nil {
		return fail(1, "%v", err)
	}
	printSummary(stderr, &res.Stats, *out)
	if *format == "safetensors" {
		printTensorSummary(stderr, ts, to)
	}
	return 0
}

// completedAfter pages the task queue's completed rollouts after a cursor
// and returns their ids and the cursor to continue from.
func completedAfter(ctx context.Context, dsn, dbPath string, after int64) ([]string, int64, error) {
	if dsn == "" {
		dsn = dbPath
	}
	q, err := taskqueue.Open(ctx, dsn, taskqueue.Options{})
	if err != nil {
		return nil, 0, fmt.Errorf("opening the task queue: %w", err)
	}
	defer q.Close()
	var ids []string
	for {
		page, next, err := q.List(ctx, taskqueue.ListFilter{After: after, Cursor: true, Limit: 10000})
		if err != nil {
			return nil, 0, err
		}
		for _, st := range page {
			ids = append(ids, st.RolloutID)
		}
		if len(page) == 0 {
			return ids, after, nil
		}
		after = next
	}
}

// serveSamples runs the lease API on addr until every sample is acknowledged
// or SIGINT/SIGTERM arrives; with an admin token every request needs it
// (controlplane.AdminAuthorized, as serve's /api/v1).
func serveSamples(addr string, ttl time.Duration, adminToken string, samples []*bridge.Sample, stderr io.Writer) error {
	q := lease.New(ttl, nil)
	for i, s := range samples {
		b, err := json.Marshal(s)
		if err != nil {
			return fmt.Errorf("encoding sample %d: %w", i, err)
		}
		q.Add(b)
	}
	ln, err := listen("--serve", addr)
	if err != nil {
		return err
	}
	handler := func(ctx *fasthttp.RequestCtx) {
		if controlplane.AdminAuthorized(ctx, adminToken, "lease API route") {
			q.Serve(ctx, string(ctx.Path()))
		}
	}
	srv := &fasthttp.Server{Handler: handler,
		ReadTimeout: 10 * time.Second, MaxRequestBodySize: 1 << 20, NoDefaultServerHeader: true}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	defer srv.Shutdown()
	fmt.Fprintf(stderr, "bridge: serving %d samples on http://%s (POST /lease {\"n\":N}, POST /ack {\"lease_id\":...})\n", len(samples), ln.Addr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-sig:
			c := q.Counts()
			fmt.Fprintf(stderr, "bridge: stopped with %d samples pending, %d leased, %d acknowledged\n", c.Pending, c.Leased, c.Acked)
			return nil
		case <-tick.C:
			if c := q.Counts(); c.Acked == len(samples) {
				fmt.Fprintf(stderr, "bridge: all %d samples acknowledged\n", c.Acked)
				return nil
			}
		}
	}
}

// writeSamples writes to a temporary file renamed into place, so a reader
// never sees half a batch.
// streamSamples builds and writes JSONL or Parquet sample by sample, to a
// temporary file renamed into place at the end (or to stdout for "-").
func streamSamples(ctx context.Context, store export.Store, o bridge.Options, path, format string, stdout io.Writer) (*bridge.Result, error) {
	newWriter := bridge.NewJSONLWriter
	if format == "parquet" {
		po := bridge.ParquetOptions{OmitLogprobs: omitLogprobs(o)}
		newWriter = func(w io.Writer) bridge.SampleWriter { return bridge.NewParquetWriter(w, po) }
	}
	if path == "-" {
		w := newWriter(stdout)
		o.Emit = w.Write
		res, err := bridge.Build(ctx, store, o)
		if err != nil {
			return nil, err
		}
		return res, w.Close()
	}
	tmp, err := createOutput(path)
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	w := newWriter(tmp)
	o.Emit = w.Write
	res, err := bridge.Build(ctx, store, o)
	if err == nil {
		err = w.Close()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	return res, nil
}

// createOutput creates the temporary file a batch is written to before it
// is renamed to path, in path's folder, with mode 0666 less the umask (as
// any file a command writes; os.CreateTemp's 0600 would make the batch
// unreadable to the trainer's other users whatever the umask says).
func createOutput(path string) (*os.File, error) {
	dir := filepath.Dir(path)
	for range 100 {
		name := filepath.Join(dir, ".bridge-"+strconv.FormatUint(rand.Uint64(), 36))
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("creating output: %w", err)
		}
		return f, nil
	}
	return nil, fmt.Errorf("creating output in %s: no free temporary name", dir)
}

func writeSamples(path, format string, to bridge.TensorOptions, stdout io.Writer, samples []*bridge.Sample) (bridge.TensorStats, error) {
	var ts bridge.TensorStats
	if path == "-" {
		return ts, bridge.WriteJSONL(stdout, samples)
	}
	tmp, err := createOutput(path)
	if err != nil {
		return ts, err
	}
	defer os.Remove(tmp.Name())
	switch format {
	case "parquet":
		err = bridge.WriteParquet(tmp, samples, bridge.ParquetOptions{OmitLogprobs: to.OmitLogprobs})
	case "safetensors":
		ts, err = bridge.WriteSafetensors(tmp, samples, to)
	default:
		err = bridge.WriteJSONL(tmp, samples)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return ts, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return ts, fmt.Errorf("writing %s: %w", path, err)
	}
	return ts, nil
}

// optionStatus is the exit status for a Build error: 2 for invalid options.
func optionStatus(err error) int {
	var oe *bridge.OptionError
	if errors.As(err, &oe) {
		return 2
	}
	return 1
}

// writeReport writes res.Report as JSON to path (when set) and explains
// rollout explain on w (when set).
func writeReport(path, explain string, res *bridge.Result, w io.Writer) error {
	if path != "" {
		b, err := json.MarshalIndent(map[string]any{"stats": res.Stats, "attempts": res.Report}, "", "  ")
		if err != nil {
			return fmt.Errorf("encoding the report: %w", err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("writing the report (--report): %w", err)
		}
	}
	if explain == "" {
		return nil
	}
	found := false
	for _, a := range res.Report {
		if a.RolloutID != explain {
			continue
		}
		found = true
		state := "included"
		if a.Reason != "" {
			state = "excluded: " + a.Reason
		}
		missing := ""
		if a.RewardMissing {
			missing = " (no reward)"
		}
		fmt.Fprintf(w, "rollout %s attempt %s (task %q, %s): group %q, score %.6g%s, %s\n", a.RolloutID, a.AttemptID, a.TaskID, a.Status, a.Group, a.Score, missing, state)
		for _, d := range a.Items {
			what := "included"
			if !d.Included {
				what = "excluded: " + d.Reason
			}
			extra := ""
			if d.Included {
				extra = fmt.Sprintf(", advantage %.6g", d.Advantage)
			}
			if d.Truncated {
				extra += ", response cut at --max-response"
			}
			fmt.Fprintf(w, "  %s %v choice %d: %s%s\n", d.Kind, d.SequenceIDs, d.ChoiceIndex, what, extra)
		}
	}
	if !found {
		fmt.Fprintf(w, "rollout %s: not selected (check --status, default %s: queued, running and cancelled attempts are not selected; --tasks, --since/--until, --attempts)\n", explain, strings.Join(bridge.DefaultStatuses, ","))
	}
	return nil
}

func printSummary(w io.Writer, st *bridge.Stats, out string) {
	fmt.Fprintf(w, "bridge: %d samples in %d groups from %d attempts (%d calls) -> %s\n", st.Samples, st.Groups, st.Attempts, st.Calls, out)
	if st.Merged > 0 || len(st.Breaks) > 0 {
		fmt.Fprintf(w, "  trajectories: %d calls merged, breaks %s\n", st.Merged, kv(st.Breaks))
	}
	if st.Trimmed > 0 || st.DroppedGroups > 0 || st.Truncated > 0 || st.FilledRewards > 0 || st.SmallGroups > 0 {
		fmt.Fprintf(w, "  truncated %d responses at --max-response; trimmed %d samples; dropped %d zero-variance groups (%d samples); %d groups below --min-group-size; %d attempts without a reward given 0\n",
			st.Truncated, st.Trimmed, st.DroppedGroups, st.DroppedSamples, st.SmallGroups, st.FilledRewards)
	}
	if st.Retokenized > 0 {
		fmt.Fprintf(w, "  retokenized: %d calls from their text, %d samples (token_source retokenized)\n", st.Retokenized, st.RetokenizedSamples)
	}
	printLeftOut(w, st)
	fmt.Fprintf(w, "  AIR hits: %s\n", kv(st.AIRHits))
	tasks := make([]string, 0, len(st.Tasks))
	for t := range st.Tasks {
		tasks = append(tasks, t)
	}
	sort.Strings(tasks)
	for _, t := range tasks {
		ts := st.Tasks[t]
		fmt.Fprintf(w, "  task %q: %d samples, reward mean %.4g std %.4g\n", t, ts.Samples, ts.Mean, ts.Std)
	}
}

func kv(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Unix(0, n), nil
	}
	return time.Parse(time.RFC3339Nano, s)
}

// printLeftOut prints what the batch left out, each reason with what
// changes it (bridge.Hint): attempts the selection did not take, calls
// attributed to no rollout, and the exclusions. With nothing left out and
// no sample it says where the calls should have come from.
func printLeftOut(w io.Writer, st *bridge.Stats) {
	reasons := func(m map[string]int) []string {
		keys := make([]string, 0, len(m))
		for k, n := range m {
			if n > 0 {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		return keys
	}
	line := func(what string, n int, reason string) {
		if h := bridge.Hint(reason, st.MinGroupSize); h != "" {
			fmt.Fprintf(w, "  %s: %s=%d (%s)\n", what, reason, n, h)
		} else {
			fmt.Fprintf(w, "  %s: %s=%d\n", what, reason, n)
		}
	}
	for _, r := range reasons(st.NotSelected) {
		line("not selected", st.NotSelected[r], r)
	}
	if st.UnattributedCalls > 0 {
		line("not selected", st.UnattributedCalls, bridge.SkipUnattributed)
	}
	excl := reasons(st.Excluded)
	for _, r := range excl {
		line("excluded", st.Excluded[r], r)
	}
	switch {
	case len(excl) > 0:
	case st.Samples > 0:
		fmt.Fprintf(w, "  excluded: none\n")
	case st.Attempts > 0 || len(st.NotSelected) > 0 || st.UnattributedCalls > 0:
		fmt.Fprintf(w, "  no sample: every call was left out for the reasons above\n")
	default:
		fmt.Fprintf(w, "  no sample: the store holds no call of any rollout (check --db or --clickhouse; agents call on http://GATEWAY/rollout/{rollout_id}/attempt/{attempt_id}/v1)\n")
	}
}
