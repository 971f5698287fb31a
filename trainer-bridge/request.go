package bridge

import (
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/rollgate/rollgate/tokenize/chattemplate"
	"github.com/rollgate/rollgate/trainer-bridge/advantage"
	"github.com/rollgate/rollgate/trainer-bridge/air"
	"github.com/rollgate/rollgate/trainer-bridge/credit"
)

// Request is one bridge run as a user states it: the command line's flags
// (rollgate bridge) and the HTTP API's JSON body (POST
// /api/v1/bridge/batches) both fill it, and Options turns it into Options,
// so the two never differ in what they accept or default. Zero values take
// the documented defaults (DefaultRequest); a nil Statuses means the default
// statuses, an empty non-nil list any status.
type Request struct {
	Tasks            []string `json:"tasks"`
	RolloutIDs       []string `json:"rollout_ids"`
	Statuses         []string `json:"statuses"`
	Agent            string   `json:"agent"` // regular expression on agent_name
	MinPolicyVersion string   `json:"min_policy_version"`
	Attempts         string   `json:"attempts"`
	SinceUnixNano    int64    `json:"since_unix_nano"`
	UntilUnixNano    int64    `json:"until_unix_nano"`
	Mode             string   `json:"mode"`
	RewardName       string   `json:"reward_name"`
	Credit           string   `json:"credit"`
	Gamma            *float64 `json:"gamma"` // nil = 1
	Estimator        string   `json:"estimator"`
	Level            string   `json:"level"`
	DropZeroVariance bool     `json:"drop_zero_variance"`
	MaxPrompt        int      `json:"max_prompt"`
	MaxResponse      int      `json:"max_response"`
	Truncation       string   `json:"truncation"`
	MissingReward    string   `json:"missing_reward"`
	MinGroupSize     int      `json:"min_group_size"`
	GroupBy          string   `json:"group_by"`
	Logprobs         string   `json:"logprobs"`
	// Report fills Result.Report (HTTP: "report" in the answer).
	Report bool `json:"report"`
	// AIR turns automatic intermediate rewards on (nil = on).
	AIR *bool `json:"air"`
	// AIRRules sets rule weights or turns rules off: "rule=weight" or
	// "rule=off" (air.RuleNames).
	AIRRules []string `json:"air_rules"`
	// AIRFailurePatterns replace the built-in regular expressions marking a
	// failed tool result (empty = built-in).
	AIRFailurePatterns []string `json:"air_failure_patterns"`
	// AIRMinRepeats is how many identical consecutive calls make air_repeat
	// hit (0 = the default, 2).
	AIRMinRepeats int  `json:"air_min_repeats"`
	WriteAIR      bool `json:"write_air"`
	// Retokenize is a folder holding the model's tokenizer.json and
	// tokenizer_config.json: calls captured without ids get retokenized ones.
	// The command line's --retokenize only: a server path is never taken
	// from a request, so the HTTP API's "retokenize" names one of the
	// operator's configured tokenizers instead (controlplane's
	// Config.BridgeTokenizers) and sets Options.Retokenize itself.
	Retokenize string `json:"-"`
	// RetokenizeAll retokenizes every call, engine ids or not
	// (Options.RetokenizeAll): the command line's --retokenize-all only, an
	// experiment's switch rather than a training option.
	RetokenizeAll bool `json:"-"`
}

// DefaultEstimator is the estimator of a Request that names none.
const DefaultEstimator = advantage.GRPO

// Options validates the request and builds the options of Build (without
// Emit, Progress or Now). Errors are *OptionError, naming the field as the
// command line spells it.
func (r *Request) Options() (Options, error) {
	o := Options{Mode: r.Mode, RewardName: r.RewardName, Level: r.Level, DropZeroVariance: r.DropZeroVariance,
		MaxPrompt: r.MaxPrompt, MaxResponse: r.MaxResponse, Truncation: r.Truncation, WriteAIR: r.WriteAIR, Gamma: 1,
		MissingReward: r.MissingReward, MinGroupSize: r.MinGroupSize, Logprobs: r.Logprobs, Report: r.Report, GroupBy: r.GroupBy}
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
		cfg := air.DefaultConfig()
		if len(r.AIRFailurePatterns) > 0 {
			for _, p := range r.AIRFailurePatterns {
				if _, err := regexp.Compile(p); err != nil {
					return o, optionErrorf("--air-failure-pattern %q: %v", p, err)
				}
			}
			cfg.FailurePatterns = r.AIRFailurePatterns
		}
		if r.AIRMinRepeats < 0 {
			return o, optionErrorf("--air-min-repeats %d is negative", r.AIRMinRepeats)
		}
		if r.AIRMinRepeats > 0 {
			cfg.MinRepeats = r.AIRMinRepeats
		}
		for _, kv := range r.AIRRules {
			name, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok {
				return o, optionErrorf("--air-rules: %q is not rule=weight or rule=off", kv)
			}
			rule := cfg.Rules[name]
			if val == "off" {
				rule.Enabled = false
			} else {
				w, err := strconv.ParseFloat(val, 64)
				if err != nil {
					return o, optionErrorf("--air-rules: %q: %v", kv, err)
				}
				rule.Enabled, rule.Weight = true, w
			}
			cfg.Rules[name] = rule
		}
		if o.AIR, err = air.New(cfg); err != nil {
			return o, optionErrorf("--air-rules: %v", err)
		}
	}
	return o, nil
}
