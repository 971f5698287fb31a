package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	taskqueue "github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/stores"
	bridge "github.com/rollgate/rollgate/trainer-bridge"
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

// bridgeConfig is rollgate bridge's command line: the bridge's options
// (bridge.Request registers their flags) and the command's own, the store,
// the output, the lease API and the reports.
type bridgeConfig struct {
	req                                   bridge.Request
	clickhouseDSN, dbPath                 string
	out, format                           string
	padID                                 int64
	tokenizerConfig                       string
	padPrompt, padResponse, batchMultiple int
	spillDir                              string
	quiet                                 bool
	after                                 int64
	queueDSN                              string
	timeout                               time.Duration
	serve                                 string
	leaseTTL                              time.Duration
	insecureAdmin                         bool
	reportPath, explain                   string
}

// RegisterFlags registers rollgate bridge's flags on fs, bound to c's
// fields (a new flag needs its line in bridgeSections).
func (c *bridgeConfig) RegisterFlags(fs *flag.FlagSet) {
	c.req.RegisterFlags(fs)
	fs.StringVar(&c.clickhouseDSN, "clickhouse", "", "ClickHouse DSN (empty = embedded store)")
	fs.StringVar(&c.dbPath, "db", defaultDB, "embedded SQLite store path, used when --clickhouse is empty")
	fs.StringVar(&c.out, "out", "", "output file (required; '-' = stdout, JSONL only)")
	fs.StringVar(&c.format, "format", "", "jsonl, parquet or safetensors (default: from the --out extension, else jsonl)")
	fs.Int64Var(&c.padID, "pad-id", 0, "padding token id of safetensors batches (default: the pad_token of --tokenizer-config, else 0)")
	fs.StringVar(&c.tokenizerConfig, "tokenizer-config", "", "a Hugging Face tokenizer_config.json whose pad_token id pads safetensors batches when --pad-id is not given")
	fs.IntVar(&c.padPrompt, "pad-prompt", 0, "safetensors: pad prompts to this many tokens (0 = the longest prompt of the batch); a longer prompt is an error, never cut. Fixed lengths let batches concatenate (verl's prompt_length)")
	fs.IntVar(&c.padResponse, "pad-response", 0, "safetensors: pad responses to this many tokens (0 = the longest response); a longer response is an error, never cut (cut with --max-response). verl's response_length")
	fs.IntVar(&c.batchMultiple, "batch-multiple", 0, "safetensors: append padding rows (all pad ids, masks 0, padding true in the metadata) until the row count is a multiple of this (0 or 1 = off)")
	fs.Int64Var(&c.after, "after", -1, "only rollouts the task queue completed after this cursor (next_after of GET /api/v1/rollouts; 0 = from the start; -1 = off)")
	fs.StringVar(&c.queueDSN, "queue", "", "task queue for --after: a SQLite path or postgres:// DSN (empty = the embedded SQLite file, --db)")
	fs.StringVar(&c.spillDir, "spill-dir", "", "folder for the samples a streamed export (JSONL, Parquet, --explain) keeps on disk until the advantages are known, at most about 5 bytes per token (a prompt shared with the previous turn is stored once), removed at the end (default: the output's folder, else $TMPDIR)")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress bar on a terminal: a progress line every 10 s instead, as when stderr is not a terminal")
	fs.DurationVar(&c.timeout, "timeout", time.Hour, "timeout of the selection and assembly")
	fs.StringVar(&c.serve, "serve", "", "instead of writing a file, serve the samples to online trainers on this address (POST /lease, POST /ack, GET /counts) until all are acknowledged")
	fs.DurationVar(&c.leaseTTL, "lease-ttl", 5*time.Minute, "with --serve: an unacknowledged lease returns its samples to the queue after this long")
	fs.BoolVar(&c.insecureAdmin, "insecure-admin", false, "allow --serve on a non-loopback address without ROLLGATE_ADMIN_TOKEN: anyone who reaches the port can then lease and acknowledge (consume) every sample. With ROLLGATE_ADMIN_TOKEN set, every request of the lease API needs Authorization: Bearer <token>, as serve's /api/v1")
	fs.StringVar(&c.reportPath, "report", "", "write a JSON report to this file: every selected attempt, its calls and samples, included or excluded with the reason")
	fs.StringVar(&c.explain, "explain", "", "print what became of this rollout's attempts, calls and samples and why (with the selection and options given; --out is then optional)")
}

// runBridge runs rollgate bridge and returns its exit status: 0, 1 when the
// store or an output fails, 2 for a bad flag or option.
func runBridge(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("bridge", bridgeSummary, stdout, bridgeSections...) // a new flag needs its line in bridgeSections
	var c bridgeConfig
	c.RegisterFlags(fs)
	setFlags, err := parseWithEnv(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return bridgeFail(stderr, 2, "%v", err)
	}
	adminToken := os.Getenv("ROLLGATE_ADMIN_TOKEN")
	to, err := c.checkOutput(setFlags, adminToken)
	if err != nil {
		return bridgeFail(stderr, 2, "%v", err)
	}
	// The flags fill one bridge.Request, as the HTTP API's JSON body does.
	o, err := c.req.Options()
	if err != nil {
		return bridgeFail(stderr, 2, "%v", err)
	}
	tty := false
	if f, ok := stderr.(*os.File); ok && !c.quiet {
		tty = isTerminal(f)
	}
	o.Progress = newProgressReporter(stderr, tty).update
	o.SpillDir = c.spillDir
	if o.SpillDir == "" && c.out != "" && c.out != "-" {
		o.SpillDir = filepath.Dir(c.out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	store, err := stores.Open(ctx, c.clickhouseDSN, c.dbPath)
	if err != nil {
		return bridgeFail(stderr, 1, "opening store: %v", err)
	}
	defer store.Close()
	if c.after >= 0 {
		ids, err := c.completedRollouts(ctx, o.Selection.RolloutIDs, stderr)
		if err != nil {
			return bridgeFail(stderr, 1, "%v", err)
		}
		if len(ids) == 0 {
			return 0
		}
		o.Selection.RolloutIDs = ids
	}
	o.Report = c.reportPath != "" || c.explain != ""
	return c.run(ctx, store, o, to, adminToken, stdout, stderr)
}

// bridgeFail prints rollgate bridge's one-line error and returns code.
func bridgeFail(stderr io.Writer, code int, format string, a ...any) int {
	fmt.Fprintf(stderr, "rollgate bridge: "+format+"\n", a...)
	return code
}

// checkOutput checks the output flags (set holds the flags given),
// settles --format and returns the safetensors options.
func (c *bridgeConfig) checkOutput(set map[string]bool, adminToken string) (bridge.TensorOptions, error) {
	if c.out == "" && c.serve == "" && c.explain == "" {
		return bridge.TensorOptions{}, errors.New("--out (or --serve, or --explain) is required")
	}
	if c.serve != "" {
		if err := requireAdminOffLoopback(adminToken, c.insecureAdmin,
			"lease and acknowledge (consume) every sample of the batch",
			"Set ROLLGATE_ADMIN_TOKEN (trainers then send Authorization: Bearer <token>)",
			listenFlag{"--serve", c.serve}); err != nil {
			return bridge.TensorOptions{}, err
		}
	}
	if c.format == "" {
		c.format = "jsonl"
		switch {
		case strings.HasSuffix(c.out, ".parquet"):
			c.format = "parquet"
		case strings.HasSuffix(c.out, ".safetensors"):
			c.format = "safetensors"
		}
	}
	if c.format != "jsonl" && c.format != "parquet" && c.format != "safetensors" {
		return bridge.TensorOptions{}, fmt.Errorf("--format %q is not jsonl, parquet or safetensors", c.format)
	}
	if c.format != "jsonl" && c.out == "-" && c.serve == "" {
		return bridge.TensorOptions{}, fmt.Errorf("%s output needs a file", c.format)
	}
	return tensorOptions(set, c.format, c.serve != "", c.padID, c.tokenizerConfig, c.padPrompt, c.padResponse, c.batchMultiple)
}

// completedRollouts returns the rollouts the task queue completed after
// --after, among selected when it names any, and says the next cursor on
// stderr; none: nothing to build.
func (c *bridgeConfig) completedRollouts(ctx context.Context, selected []string, stderr io.Writer) ([]string, error) {
	ids, next, err := completedAfter(ctx, c.queueDSN, c.dbPath, c.after)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "rollgate bridge: %d rollouts completed after cursor %d; next cursor %d (pass --after %d next time)\n", len(ids), c.after, next, next)
	if len(ids) == 0 || len(selected) == 0 {
		return ids, nil
	}
	keep := map[string]bool{}
	for _, id := range selected {
		keep[id] = true
	}
	var both []string
	for _, id := range ids {
		if keep[id] {
			both = append(both, id)
		}
	}
	return both, nil
}

// run builds the batch and explains it (--explain alone), streams it to
// --out (JSONL, Parquet), serves it (--serve) or writes it whole
// (safetensors).
func (c *bridgeConfig) run(ctx context.Context, store export.Store, o bridge.Options, to bridge.TensorOptions, adminToken string, stdout, stderr io.Writer) int {
	explainTo := stdout
	if c.out == "-" {
		explainTo = stderr // stdout carries the samples
	}
	var (
		res *bridge.Result
		err error
	)
	switch {
	case c.out == "" && c.serve == "":
		// --explain alone: build (streamed, nothing kept) and explain.
		o.Emit = func(*bridge.Sample) error { return nil }
		res, err = bridge.Build(ctx, store, o)
	case c.serve == "" && c.format != "safetensors":
		// JSONL and Parquet are streamed: memory stays bounded by one
		// attempt however many samples the export has.
		res, err = streamSamples(ctx, store, o, c.out, c.format, stdout)
	default:
		res, err = bridge.Build(ctx, store, o)
	}
	if err != nil {
		return bridgeFail(stderr, optionStatus(err), "%v", err)
	}
	if err := writeReport(c.reportPath, c.explain, res, explainTo); err != nil {
		return bridgeFail(stderr, 1, "%v", err)
	}
	switch {
	case c.out == "" && c.serve == "":
		printSummary(stderr, &res.Stats, "(no output)")
	case c.serve != "":
		printSummary(stderr, &res.Stats, "http://"+c.serve)
		if err := serveSamples(c.serve, c.leaseTTL, adminToken, res.Samples, stderr); err != nil {
			return bridgeFail(stderr, 1, "%v", err)
		}
	case c.format != "safetensors":
		printSummary(stderr, &res.Stats, c.out)
	default:
		return c.writeBatch(o, to, res, stdout, stderr)
	}
	return 0
}

// writeBatch writes a batch built whole to --out (safetensors) and says so.
func (c *bridgeConfig) writeBatch(o bridge.Options, to bridge.TensorOptions, res *bridge.Result, stdout, stderr io.Writer) int {
	to.OmitLogprobs = omitLogprobs(o)
	ts, err := writeSamples(c.out, c.format, to, stdout, res.Samples)
	if err != nil {
		return bridgeFail(stderr, 1, "%v", err)
	}
	printSummary(stderr, &res.Stats, c.out)
	printTensorSummary(stderr, ts, to)
	return 0
}

// optionStatus is the exit status for a Build error: 2 for invalid options.
func optionStatus(err error) int {
	var oe *bridge.OptionError
	if errors.As(err, &oe) {
		return 2
	}
	return 1
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
