package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// flagSection is one titled group of a command's flags in its --help.
type flagSection struct {
	Title string
	// Flags are the flag names in the order shown. A name ending in "*"
	// takes, in alphabetical order, every flag with that prefix that no
	// section names exactly ("agl-*").
	Flags []string
}

// serveSections groups serve's flags in its --help, essentials first.
// A new flag of serve needs a line here: TestFlagSections fails on a flag
// no section takes (or on a name here that is no flag), so none is shown
// ungrouped.
var serveSections = []flagSection{
	{"Essentials", []string{"listen", "upstream", "upstream-kind", "db", "clickhouse", "config"}},
	{"Backends and routing", []string{"model", "policy-version", "routing", "routing-load-factor",
		"retries", "retry-backoff", "health-interval", "unhealthy-after", "unhealthy-cooldown"}},
	{"Capture", []string{"inject-logprobs", "capture-embedding-bodies", "detok-check",
		"disable-tokenize-fallback", "clickhouse-ttl-days", "sequence-retention", "sequence-timeout", "sequence-lease", "unattributed"}},
	{"Token-in (vLLM >= 0.32)", []string{"token-in", "token-in-*"}},
	{"Durability (spool and write-ahead log)", []string{"spool-dir", "spool-*", "capture-wal", "capture-wal-*"}},
	{"Training loop (task queue, bridge API)", []string{"queue", "task-lease", "bridge-lease-ttl", "bridge-tokenizers", "public-url"}},
	{"Viewer", []string{"ui", "ui-tokenizer"}},
	{"Security", []string{"insecure-admin", "allowed-hosts", "tls-cert", "tls-key", "forward-client-authorization",
		"max-body-bytes", "max-response-body-bytes"}},
	{"Scale", []string{"max-concurrency", "queue-timeout", "pause-max-hold", "memory-limit", "gc-headroom",
		"max-tracked-attempts", "max-tracked-attempt-bytes"}},
	{"Agent Lightning", []string{"agl", "agl-*"}},
	{"OTLP (OpenTelemetry export)", []string{"otlp-endpoint", "otlp-*"}},
	{"Tuning", []string{"capture-queue", "capture-queue-bytes", "capture-batch-size", "capture-batch-bytes",
		"capture-flush-interval", "capture-workers", "backend-read-buffer", "connect-timeout", "idle-timeout",
		"upstream-timeout", "client-read-timeout", "client-write-timeout", "client-idle-timeout"}},
	{"Logging and debugging", []string{"log-level", "debug-listen"}},
}

// bridgeSections groups bridge's flags in its --help, as serveSections.
var bridgeSections = []flagSection{
	{"Essentials", []string{"db", "clickhouse", "out", "format", "serve"}},
	{"Selection", []string{"status", "attempts", "tasks", "rollouts", "agent", "since", "until", "after", "queue", "min-policy-version"}},
	{"Samples", []string{"mode", "max-prompt", "max-response", "truncation", "logprobs", "mixed-policy", "retokenize", "retokenize-all"}},
	{"Rewards and advantages", []string{"reward-name", "missing-reward", "credit", "gamma", "estimator", "level",
		"group-by", "min-group-size", "drop-zero-variance"}},
	{"Automatic intermediate rewards (AIR)", []string{"air", "air-*"}},
	{"Safetensors padding", []string{"pad-id", "tokenizer-config", "pad-prompt", "pad-response", "batch-multiple"}},
	{"Lease API (--serve)", []string{"lease-ttl", "insecure-admin"}},
	{"Reports and running", []string{"explain", "report", "quiet", "spill-dir", "timeout"}},
}

// sectionFlags returns, for each section, the flags of fs it shows (in
// order), and the flags no section takes.
func sectionFlags(fs *flag.FlagSet, sections []flagSection) (grouped [][]*flag.Flag, rest []*flag.Flag) {
	named := map[string]bool{}
	for _, s := range sections {
		for _, n := range s.Flags {
			named[n] = true
		}
	}
	taken := map[string]bool{}
	grouped = make([][]*flag.Flag, len(sections))
	for i, s := range sections {
		for _, n := range s.Flags {
			if prefix, ok := strings.CutSuffix(n, "*"); ok {
				fs.VisitAll(func(f *flag.Flag) { // alphabetical
					if strings.HasPrefix(f.Name, prefix) && !named[f.Name] && !taken[f.Name] {
						taken[f.Name] = true
						grouped[i] = append(grouped[i], f)
					}
				})
			} else if f := fs.Lookup(n); f != nil && !taken[n] {
				taken[n] = true
				grouped[i] = append(grouped[i], f)
			}
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !taken[f.Name] {
			rest = append(rest, f)
		}
	})
	return grouped, rest
}

// printHelp writes a command's help: its summary, then its flags, by
// section when it has sections (flags no section takes last, under
// "Other"), else in alphabetical order.
func printHelp(w io.Writer, fs *flag.FlagSet, summary string, sections []flagSection) {
	fmt.Fprintf(w, "%s\n\nFlags (each also read from ROLLGATE_<FLAG_NAME_IN_UPPER_SNAKE_CASE>):\n", summary)
	if len(sections) == 0 {
		fs.VisitAll(func(f *flag.Flag) { printFlag(w, f) })
		return
	}
	grouped, rest := sectionFlags(fs, sections)
	for i, s := range sections {
		fmt.Fprintf(w, "\n%s:\n", s.Title)
		for _, f := range grouped[i] {
			printFlag(w, f)
		}
	}
	if len(rest) > 0 {
		fmt.Fprintf(w, "\nOther:\n")
		for _, f := range rest {
			printFlag(w, f)
		}
	}
}

// printFlag writes one flag as flag.PrintDefaults does, with "--" before
// its name as the README and the error messages write it.
func printFlag(w io.Writer, f *flag.Flag) {
	var buf bytes.Buffer
	one := flag.NewFlagSet("", flag.ContinueOnError)
	one.SetOutput(&buf)
	one.Var(f.Value, f.Name, f.Usage)
	one.Lookup(f.Name).DefValue = f.DefValue // not the value parsed so far
	one.PrintDefaults()
	w.Write(bytes.Replace(buf.Bytes(), []byte("  -"), []byte("  --"), 1))
}

// parseFailure is a flag set's output: the flag package writes a parse
// error there just before it calls Usage, so Usage can tell a parse error
// (the command then prints one line, see flagError) from -h (the help).
type parseFailure struct{ failed bool }

func (p *parseFailure) Write(b []byte) (int, error) {
	p.failed = true
	return len(b), nil
}

// flagErrorPrefixes start the flag package's parse errors other than an
// unknown flag's.
var flagErrorPrefixes = []string{"flag needs an argument: ", "invalid value ", "invalid boolean value ", "invalid boolean flag ", "bad flag syntax: "}

// flagError rewrites a parse error of fs into one line that says what is
// wrong and where the flags are listed: an unknown flag with the closest
// names ("unknown flag --upstrem; did you mean --upstream?"). Other errors,
// flag.ErrHelp included, are returned as they are.
func flagError(fs *flag.FlagSet, err error) error {
	if err == nil {
		return nil
	}
	more := " (" + fs.Name() + " --help lists every flag)"
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		near := closestFlags(fs, name, 3)
		for i := range near {
			near[i] = "--" + near[i]
		}
		if len(near) > 0 {
			return fmt.Errorf("unknown flag --%s; did you mean %s?%s", name, oneOf(near), more)
		}
		return fmt.Errorf("unknown flag --%s%s", name, more)
	}
	for _, p := range flagErrorPrefixes {
		if strings.HasPrefix(msg, p) {
			return fmt.Errorf("%w%s", err, more)
		}
	}
	return err
}

// oneOf joins names as "a", "a or b", "a, b or c".
func oneOf(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// closestFlags returns up to max flag names of fs close to name.
func closestFlags(fs *flag.FlagSet, name string, max int) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return closest(names, name, max)
}

// closest returns up to max of names close to name: those it starts, and
// those within a few edits of it (a transposition is one), closest first,
// ties in the order of names.
func closest(names []string, name string, max int) []string {
	limit := 1 + len(name)/5 // "db" 1, "upstrem" 2, "capture-qeue" 3
	type near struct {
		name string
		d    int
	}
	var found []near
	for _, n := range names {
		d := editDistance(name, n)
		if strings.HasPrefix(n, name) && len(name) >= 2 {
			d = min(d, limit)
		}
		if d <= limit {
			found = append(found, near{n, d})
		}
	}
	slices.SortStableFunc(found, func(a, b near) int { return a.d - b.d })
	var out []string
	for _, n := range found[:min(len(found), max)] {
		out = append(out, n.name)
	}
	return out
}

// editDistance is the optimal string alignment distance of a and b: the
// insertions, deletions, substitutions and transpositions of adjacent
// bytes that turn one into the other (each of a flag name's ASCII bytes).
func editDistance(a, b string) int {
	prev2, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
