package bridge

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/trainer-bridge/advantage"
	"github.com/rollgate/rollgate/trainer-bridge/air"
	"github.com/rollgate/rollgate/trainer-bridge/credit"
)

// parseRequest registers a Request's flags on a new flag set and parses args.
func parseRequest(t *testing.T, args ...string) *Request {
	t.Helper()
	var r Request
	fs := flag.NewFlagSet("bridge", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	r.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return &r
}

// TestRequestFlagDefaults: the command line's defaults make the same
// Options as the HTTP API's empty request once Build has filled in its
// defaults (resolve; the selection reads Attempts "" as latest), so the
// two never differ.
func TestRequestFlagDefaults(t *testing.T) {
	fromFlags, err := parseRequest(t).Options()
	if err != nil {
		t.Fatal(err)
	}
	fromJSON, err := (&Request{}).Options()
	if err != nil {
		t.Fatal(err)
	}
	if fromFlags.Selection.Attempts != AttemptsLatest || fromJSON.Selection.Attempts != "" {
		t.Fatalf("attempts: flags %q, request %q", fromFlags.Selection.Attempts, fromJSON.Selection.Attempts)
	}
	fromJSON.Selection.Attempts = AttemptsLatest
	for _, o := range []*Options{&fromFlags, &fromJSON} {
		if err := o.resolve(); err != nil {
			t.Fatal(err)
		}
		o.Now = nil // a func: never deeply equal
	}
	if !reflect.DeepEqual(fromFlags, fromJSON) {
		t.Fatalf("flag defaults:\n%+v\nempty request:\n%+v", fromFlags, fromJSON)
	}
}

// TestRequestFlags: each flag lands in its Options field, lists split at
// commas, --status "" is any status, times in either form.
func TestRequestFlags(t *testing.T) {
	r := parseRequest(t, "--tasks", "a, b,", "--rollouts", "r1", "--status", "", "--since", "5", "--until", "2026-01-02T03:04:05Z",
		"--agent", "^solver$", "--min-policy-version", "2", "--attempts", "all", "--mode", "trajectories", "--reward-name", "score",
		"--credit", "discounted", "--gamma", "0.5", "--estimator", "rloo", "--level", "transition", "--drop-zero-variance",
		"--max-prompt", "7", "--max-response", "8", "--truncation", "trim", "--missing-reward", "drop", "--min-group-size", "3",
		"--group-by", "task", "--logprobs", "omit", "--air-rules", "air_repeat=off", "--air-failure-pattern", "boom",
		"--air-failure-pattern", "bang", "--air-min-repeats", "4", "--air-write")
	o, err := r.Options()
	if err != nil {
		t.Fatal(err)
	}
	sel := o.Selection
	if !slices.Equal(sel.TaskIDs, []string{"a", "b"}) || !slices.Equal(sel.RolloutIDs, []string{"r1"}) || sel.Statuses == nil || len(sel.Statuses) != 0 ||
		!sel.Since.Equal(time.Unix(0, 5)) || !sel.Until.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) ||
		sel.AgentName.String() != "^solver$" || sel.MinPolicyVersion != "2" || sel.Attempts != AttemptsAll {
		t.Errorf("selection: %+v", sel)
	}
	if o.Mode != ModeTrajectories || o.RewardName != "score" || o.Credit != credit.Discounted || o.Gamma != 0.5 ||
		o.Estimator != advantage.RLOO || o.Level != LevelTransition || !o.DropZeroVariance || o.MaxPrompt != 7 || o.MaxResponse != 8 ||
		o.Truncation != TruncTrim || o.MissingReward != MissingDrop || o.MinGroupSize != 3 || o.GroupBy != GroupTask ||
		o.Logprobs != LogprobsOmit || !o.WriteAIR || o.AIR == nil || o.AIR.Enabled(air.RuleRepeat) {
		t.Errorf("options: %+v", o)
	}
	if !slices.Equal(r.AIRFailurePatterns, []string{"boom", "bang"}) || r.AIRMinRepeats != 4 {
		t.Errorf("AIR flags: %q %d", r.AIRFailurePatterns, r.AIRMinRepeats)
	}
	if o, err = parseRequest(t, "--air=false").Options(); err != nil || o.AIR != nil {
		t.Errorf("--air=false: AIR %v, %v", o.AIR, err)
	}
	// Options may be called again: the same result.
	again, err := r.Options()
	if err != nil || !slices.Equal(again.Selection.TaskIDs, sel.TaskIDs) || !again.Selection.Since.Equal(sel.Since) {
		t.Errorf("second Options: %+v %v", again.Selection, err)
	}
}

// TestRequestFlagErrors: a bad time is an *OptionError naming its flag; a
// bad failure pattern is refused while parsing, as before.
func TestRequestFlagErrors(t *testing.T) {
	for _, flagName := range []string{"--since", "--until"} {
		_, err := parseRequest(t, flagName, "yesterday").Options()
		var oe *OptionError
		if !errors.As(err, &oe) || !strings.HasPrefix(err.Error(), flagName+": ") {
			t.Errorf("%s yesterday: %v, want an *OptionError starting %q", flagName, err, flagName+": ")
		}
	}
	var r Request
	fs := flag.NewFlagSet("bridge", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	r.RegisterFlags(fs)
	if err := fs.Parse([]string{"--air-failure-pattern", "("}); err == nil || !strings.Contains(err.Error(), "air-failure-pattern") {
		t.Errorf("--air-failure-pattern (: %v", err)
	}
}
