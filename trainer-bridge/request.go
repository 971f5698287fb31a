package bridge

import (
	"flag"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/rollgate/rollgate/trainer-bridge/advantage"
	"github.com/rollgate/rollgate/trainer-bridge/air"
	"github.com/rollgate/rollgate/trainer-bridge/credit"
)

// Request is one bridge run as a user states it: the command line's flags
// (rollgate bridge, RegisterFlags) and the HTTP API's JSON body (POST
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
	MixedPolicy      string   `json:"mixed_policy"`
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

	// flags holds, when RegisterFlags registered the command line's flags,
	// those whose text becomes other fields in Options (fromFlags).
	flags *requestFlags
}

// DefaultEstimator is the estimator of a Request that names none.
const DefaultEstimator = advantage.GRPO

// requestFlags are the flags of a Request whose command-line form is not
// the field's: comma-separated lists, times, and the pointers' values.
type requestFlags struct {
	tasks, rollouts, statuses, airRules string
	since, until                        string
	gamma                               float64
	air                                 bool
}

// RegisterFlags registers on fs the flags of rollgate bridge that fill r
// (selection, samples, rewards and advantages, AIR, retokenizing), with
// their defaults; Options then reads them. The command's other flags
// (store, output, lease API, reports) are its own.
func (r *Request) RegisterFlags(fs *flag.FlagSet) {
	f := &requestFlags{}
	r.flags = f
	r.registerSelectionFlags(fs, f)
	fs.StringVar(&r.MixedPolicy, "mixed-policy", "", "keep (default: samples whose tokens more than one policy version sampled, a generation resumed after a weight update, are kept and marked mixed_policy; each token's rollout_log_probs is its own policy's) or drop (left out, counted as mixed_policy)")
	fs.StringVar(&r.Logprobs, "logprobs", "", "keep (default: write rollout_log_probs; samples without sampling logprobs are excluded as no_logprobs) or omit (leave rollout_log_probs out of the output, keep every sample); default omit with --retokenize")
	fs.StringVar(&r.Mode, "mode", ModeTransitions, "transitions or trajectories")
	fs.StringVar(&r.RewardName, "reward-name", "primary", "name of the episode and per-call rewards")
	fs.StringVar(&r.Credit, "credit", string(credit.Identical), "credit assignment: identical, discounted, last")
	fs.Float64Var(&f.gamma, "gamma", 1, "discount for --credit discounted")
	fs.StringVar(&r.Estimator, "estimator", "grpo", "advantage: grpo, drgrpo, rloo, reinforce++-baseline, none")
	fs.StringVar(&r.Level, "level", LevelRollout, "advantage level: rollout (broadcast) or transition")
	fs.BoolVar(&r.DropZeroVariance, "drop-zero-variance", false, "drop groups whose scores are all equal")
	fs.StringVar(&r.MissingReward, "missing-reward", MissingZero, "a selected attempt without an episode reward: 0 (reward 0, counted), drop (exclude it: no_reward) or drop-group (exclude its whole group: missing_reward_group)")
	fs.StringVar(&r.GroupBy, "group-by", GroupGroup, "advantage group (the trainer's uid): group (the rollout's group_id: one per task per enqueue call of POST /api/v1/tasks, or given to POST /api/v1/rollouts; rollouts without one as task+policy), task+policy (task and the policy version of the attempt's first call) or task")
	fs.IntVar(&r.MinGroupSize, "min-group-size", 0, "exclude the samples of groups sampled with fewer members (small_group); 0 = 2 for grpo, drgrpo and rloo, 1 otherwise")
	fs.IntVar(&r.MaxPrompt, "max-prompt", 0, "maximum prompt tokens (0 = no limit)")
	fs.IntVar(&r.MaxResponse, "max-response", 0, "maximum response tokens (0 = no limit)")
	fs.StringVar(&r.Truncation, "truncation", TruncCut, "over a limit: cut (a response is cut at --max-response and kept, marked truncated; a prompt over --max-prompt excludes the sample: prompt_too_long), drop (exclude the sample) or trim (off-policy: also keeps the last --max-prompt prompt tokens, a context the policy never saw)")
	r.registerAIRFlags(fs, f)
	fs.StringVar(&r.Retokenize, "retokenize", "", "Hugging Face model folder (tokenizer.json, tokenizer_config.json, chat_template.jinja if shipped): calls captured without token ids (token_source none) get ids from its chat template and tokenizer, marked token_source retokenized, logprobs 0, never merged with engine ids by --mode trajectories (default off: such calls are excluded as unverified_ids). Its files must be regular files (symlinks to them are followed) of at most 64 MiB each; a device, FIFO or larger file is refused")
	fs.BoolVar(&r.RetokenizeAll, "retokenize-all", false, "with --retokenize: rebuild the ids of every call from its text (chat template + tokenizer), even those captured with the engine's ids, and drop the engine's logprobs (token_source retokenized, logprobs omitted by default); for measuring what retokenising changes (examples/train-cpu/RETOKENIZE.md), not for training")
}

// registerSelectionFlags registers the flags of r.Selection's fields.
func (r *Request) registerSelectionFlags(fs *flag.FlagSet, f *requestFlags) {
	fs.StringVar(&f.since, "since", "", "first call at or after this time (RFC 3339 or unix nanoseconds)")
	fs.StringVar(&f.until, "until", "", "first call before this time (RFC 3339 or unix nanoseconds)")
	fs.StringVar(&f.tasks, "tasks", "", "comma-separated task ids (empty = all)")
	fs.StringVar(&f.statuses, "status", strings.Join(DefaultStatuses, ","), "comma-separated attempt statuses (empty = any, rewarded or not): succeeded, failed, cancelled, queued, running, or "+StatusUnregistered+" = rollouts never registered (calls on the per-rollout URL alone), selected once they have an episode reward, which marks their end (without one: unfinished). Failed attempts train with their reward (0 when none), as Agent Lightning does")
	fs.StringVar(&r.Agent, "agent", "", "regular expression on agent_name (empty = all agents)")
	fs.StringVar(&r.MinPolicyVersion, "min-policy-version", "", "drop calls served by an older policy version")
	fs.StringVar(&f.rollouts, "rollouts", "", "comma-separated rollout ids (empty = all)")
	fs.StringVar(&r.Attempts, "attempts", AttemptsLatest, "latest or all attempts per rollout")
}

// registerAIRFlags registers the --air* flags.
func (r *Request) registerAIRFlags(fs *flag.FlagSet, f *requestFlags) {
	fs.BoolVar(&f.air, "air", true, "compute automatic intermediate rewards")
	fs.BoolVar(&r.WriteAIR, "air-write", false, "store AIR outcomes in the rewards table (source = rule name)")
	fs.StringVar(&f.airRules, "air-rules", "", "comma-separated rule=weight or rule=off, e.g. air_truncated=-1,air_repeat=off (rules: "+strings.Join(air.RuleNames, ", ")+")")
	fs.Func("air-failure-pattern", "regular expression marking a failed tool result (repeatable; default: built-in patterns)", func(s string) error {
		if _, err := regexp.Compile(s); err != nil {
			return err
		}
		r.AIRFailurePatterns = append(r.AIRFailurePatterns, s)
		return nil
	})
	fs.IntVar(&r.AIRMinRepeats, "air-min-repeats", 2, "identical consecutive calls from which air_repeat hits")
}

// fromFlags sets the fields whose flags RegisterFlags keeps as text (none
// when it was not called): the lists split at commas (--status "" is any
// status), the times parsed, Gamma and AIR pointing at their flags' values.
func (r *Request) fromFlags() error {
	f := r.flags
	if f == nil {
		return nil
	}
	r.Tasks, r.RolloutIDs, r.AIRRules = splitList(f.tasks), splitList(f.rollouts), splitList(f.airRules)
	if r.Statuses = splitList(f.statuses); r.Statuses == nil {
		r.Statuses = []string{} // --status "": any status
	}
	r.Gamma, r.AIR = &f.gamma, &f.air
	since, err := parseTime(f.since)
	if err != nil {
		return optionErrorf("--since: %v", err)
	}
	until, err := parseTime(f.until)
	if err != nil {
		return optionErrorf("--until: %v", err)
	}
	r.SinceUnixNano, r.UntilUnixNano = 0, 0
	if !since.IsZero() {
		r.SinceUnixNano = since.UnixNano()
	}
	if !until.IsZero() {
		r.UntilUnixNano = until.UnixNano()
	}
	return nil
}

// splitList splits a comma-separated list, dropping empty items (nil for
// none).
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// parseTime parses unix nanoseconds or RFC 3339 ("" is the zero time).
func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Unix(0, n), nil
	}
	return time.Parse(time.RFC3339Nano, s)
}
