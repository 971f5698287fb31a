package bridge

// Every check of the bridge's options: a Request's (Options, the command
// line's and the HTTP API's) and Build's own (resolve, for any Options).

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rollgate/rollgate/tokenize/chattemplate"
	"github.com/rollgate/rollgate/trainer-bridge/advantage"
	"github.com/rollgate/rollgate/trainer-bridge/air"
	"github.com/rollgate/rollgate/trainer-bridge/credit"
)

// Options validates the request and builds the options of Build (without
// Emit, Progress or Now). Errors are *OptionError, naming the field as the
// command line spells it. After RegisterFlags it first sets the fields its
// flags fill from their text.
func (r *Request) Options() (Options, error) {
	if err := r.fromFlags(); err != nil {
		return Options{}, err
	}
	o := Options{Mode: r.Mode, RewardName: r.RewardName, Level: r.Level, DropZeroVariance: r.DropZeroVariance,
		MaxPrompt: r.MaxPrompt, MaxResponse: r.MaxResponse, Truncation: r.Truncation, WriteAIR: r.WriteAIR, Gamma: 1,
		MissingReward: r.MissingReward, MinGroupSize: r.MinGroupSize, Logprobs: r.Logprobs, Report: r.Report, GroupBy: r.GroupBy, MixedPolicy: r.MixedPolicy}
	if r.Gamma != nil {
		o.Gamma = *r.Gamma
	}
	var err error
	if r.Credit != "" {
		if o.Credit, err = credit.ParseMode(r.Credit); err != nil {
			return o, optionErrorf("--credit: %v", err)
		}
	}
	est := r.Estimator
	if est == "" {
		est = string(DefaultEstimator)
	}
	if o.Estimator, err = advantage.Parse(est); err != nil {
		return o, optionErrorf("--estimator: %v", err)
	}
	if r.Logprobs != "" && r.Logprobs != LogprobsKeep && r.Logprobs != LogprobsOmit {
		return o, optionErrorf("--logprobs %q is not %s or %s", r.Logprobs, LogprobsKeep, LogprobsOmit)
	}
	sel := Selection{TaskIDs: r.Tasks, RolloutIDs: r.RolloutIDs, Statuses: r.Statuses,
		MinPolicyVersion: r.MinPolicyVersion, Attempts: r.Attempts}
	if sel.Statuses == nil {
		sel.Statuses = DefaultSelection().Statuses
	}
	if r.SinceUnixNano > 0 {
		sel.Since = time.Unix(0, r.SinceUnixNano)
	}
	if r.UntilUnixNano > 0 {
		sel.Until = time.Unix(0, r.UntilUnixNano)
	}
	if strings.TrimSpace(r.Agent) != "" {
		if sel.AgentName, err = regexp.Compile(r.Agent); err != nil {
			return o, optionErrorf("--agent: %v", err)
		}
	}
	o.Selection = sel
	if r.Retokenize != "" {
		rt, err := chattemplate.LoadDir(r.Retokenize)
		if err != nil {
			return o, optionErrorf("--retokenize: %v", err)
		}
		o.Retokenize = rt
	}
	o.RetokenizeAll = r.RetokenizeAll
	if r.AIR == nil || *r.AIR {
		if o.AIR, err = r.airEngine(); err != nil {
			return o, err
		}
	}
	return o, nil
}

// airEngine builds the AIR engine of r's AIR options: failure patterns,
// minimum repeats and rule weights.
func (r *Request) airEngine() (*air.Engine, error) {
	cfg := air.DefaultConfig()
	if len(r.AIRFailurePatterns) > 0 {
		for _, p := range r.AIRFailurePatterns {
			if _, err := regexp.Compile(p); err != nil {
				return nil, optionErrorf("--air-failure-pattern %q: %v", p, err)
			}
		}
		cfg.FailurePatterns = r.AIRFailurePatterns
	}
	if r.AIRMinRepeats < 0 {
		return nil, optionErrorf("--air-min-repeats %d is negative", r.AIRMinRepeats)
	}
	if r.AIRMinRepeats > 0 {
		cfg.MinRepeats = r.AIRMinRepeats
	}
	for _, kv := range r.AIRRules {
		name, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return nil, optionErrorf("--air-rules: %q is not rule=weight or rule=off", kv)
		}
		rule := cfg.Rules[name]
		if val == "off" {
			rule.Enabled = false
		} else {
			w, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return nil, optionErrorf("--air-rules: %q: %v", kv, err)
			}
			rule.Enabled, rule.Weight = true, w
		}
		cfg.Rules[name] = rule
	}
	e, err := air.New(cfg)
	if err != nil {
		return nil, optionErrorf("--air-rules: %v", err)
	}
	return e, nil
}

// resolve fills in the defaults of o's zero values and checks o's values,
// as Build does before it reads anything. Errors are *OptionError.
func (o *Options) resolve() error {
	if o.RewardName == "" {
		o.RewardName = "primary"
	}
	if o.Credit == "" {
		o.Credit = credit.Identical
	}
	if o.Estimator == "" {
		o.Estimator = advantage.None
	}
	if o.RetokenizeAll && o.Retokenize == nil {
		return optionErrorf("bridge: --retokenize-all needs --retokenize (the model's tokenizer and chat template)")
	}
	if o.Logprobs == "" && o.Retokenize != nil {
		// Retokenized samples have no logprobs at all: a batch that asks for
		// them leaves rollout_log_probs out rather than exclude them.
		o.Logprobs = LogprobsOmit
	}
	for _, c := range []struct {
		v       *string
		flag    string
		allowed []string // the first is the default
	}{
		{&o.Mode, "--mode", []string{ModeTransitions, ModeTrajectories}},
		{&o.Level, "--level", []string{LevelRollout, LevelTransition}},
		{&o.Truncation, "--truncation", []string{TruncCut, TruncDrop, TruncTrim}},
		{&o.MissingReward, "--missing-reward", []string{MissingZero, MissingDrop, MissingDropGroup}},
		{&o.Logprobs, "--logprobs", []string{LogprobsKeep, LogprobsOmit}},
		{&o.MixedPolicy, "--mixed-policy", []string{MixedKeep, MixedDrop}},
		{&o.GroupBy, "--group-by", []string{GroupGroup, GroupTask, GroupTaskPolicy}},
	} {
		if *c.v == "" {
			*c.v = c.allowed[0]
		}
		if !slices.Contains(c.allowed, *c.v) {
			return optionErrorf("bridge: %s %q is not one of %s", c.flag, *c.v, strings.Join(c.allowed, ", "))
		}
	}
	if o.MinGroupSize < 0 {
		return optionErrorf("bridge: min group size %d is negative (--min-group-size)", o.MinGroupSize)
	}
	if o.MinGroupSize == 0 {
		o.MinGroupSize = 1
		switch o.Estimator {
		case advantage.GRPO, advantage.DrGRPO, advantage.RLOO:
			o.MinGroupSize = 2
		}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

// OptionError is an invalid Options value: the caller's mistake (a 400 over
// HTTP, exit status 2 on the command line), not a store failure.
type OptionError struct{ msg string }

func (e *OptionError) Error() string { return e.msg }

func optionErrorf(format string, a ...any) error {
	return &OptionError{msg: fmt.Sprintf(format, a...)}
}
