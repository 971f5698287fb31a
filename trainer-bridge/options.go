package bridge

import (
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/tokenize/chattemplate"
	"github.com/rollgate/rollgate/trainer-bridge/advantage"
	"github.com/rollgate/rollgate/trainer-bridge/air"
	"github.com/rollgate/rollgate/trainer-bridge/credit"
)

// Advantage levels.
const (
	LevelRollout    = "rollout"    // one score per attempt (R + sum of process rewards), advantage broadcast to its samples
	LevelTransition = "transition" // every sample is scored and grouped on its own (Agent Lightning)
)

// Options configure Build. The zero value plus a Selection is LightningRL:
// transitions, identical credit, reward "primary", no advantage.
type Options struct {
	// toolSpans are the agent's failed tool spans by (rollout, attempt), read
	// once per Build for the air_tool_span rule.
	toolSpans map[[2]string][]export.Span

	Selection  Selection
	Mode       string // ModeTransitions (default) or ModeTrajectories
	RewardName string // episode and per-call reward name, default "primary"
	Credit     credit.Mode
	Gamma      float64 // for credit.Discounted
	Estimator  advantage.Estimator
	Level      string // LevelRollout (default) or LevelTransition
	// DropZeroVariance drops groups whose scores are all equal.
	DropZeroVariance bool
	// AIR, when set, computes automatic intermediate rewards over every call
	// of each selected attempt and adds them to the process rewards.
	AIR *air.Engine
	// WriteAIR stores the AIR outcomes in the rewards table.
	WriteAIR bool
	// MaxPrompt and MaxResponse limit sample lengths (0 = no limit);
	// Truncation is TruncCut (default), TruncDrop or TruncTrim.
	MaxPrompt, MaxResponse int
	Truncation             string
	// MissingReward says what a selected attempt without an episode reward
	// gets: MissingZero (default: reward 0, as Agent Lightning; counted in
	// Stats.FilledRewards), MissingDrop (the attempt is excluded, no_reward)
	// or MissingDropGroup (its whole group is excluded, missing_reward_group).
	MissingReward string
	// MinGroupSize excludes the samples of groups sampled with fewer
	// members (small_group): 0 = the estimator's default (2 for grpo,
	// drgrpo and rloo, whose baseline needs siblings; 1 otherwise).
	MinGroupSize int
	// Logprobs is LogprobsKeep (default: the output carries
	// rollout_log_probs, so a sample without the engine's logprobs is
	// excluded as no_logprobs rather than written with zeros) or
	// LogprobsOmit (the output leaves rollout_log_probs out; every sample
	// is kept). Empty: LogprobsKeep, or LogprobsOmit when Retokenize is set.
	Logprobs string
	// MixedPolicy is MixedKeep (default: samples whose tokens more than one
	// policy version sampled are kept, marked mixed_policy) or MixedDrop
	// (left out as ExclMixedPolicy). See mixed.go.
	MixedPolicy string
	// Now stamps AIR rows; nil = time.Now.
	Now func() time.Time
	// Progress, when set, is called after each attempt read and, with
	// Emit, after each sample handed out; it must be cheap (throttle any
	// drawing) and must not keep p.
	Progress func(p *Progress)
	// Retokenize, when set, rebuilds the ids of calls captured without them
	// (token_source "none": hosted APIs, llama.cpp's chat route, SGLang
	// streaming chat) from the model's chat template and tokenizer, instead
	// of excluding them; their samples carry token_source "retokenized" and
	// zero rollout logprobs (recompute them in the trainer), are counted in
	// Stats.Retokenized and never merged with other calls' ids in trajectory
	// mode. Calls with ids (engine, tokenize) are never touched unless
	// RetokenizeAll is set. Nil (the default) excludes such calls as
	// unverified_ids.
	Retokenize Retokenizer
	// RetokenizeAll (with Retokenize) rebuilds the ids of every call from
	// its text, even when the engine's ids were captured, and drops the
	// engine's logprobs: every sample is then retokenized. It exists to
	// measure what retokenising does to training data (the experiment of
	// examples/train-cpu/RETOKENIZE.md), not to train on.
	RetokenizeAll bool
	// GroupBy chooses the advantage group (the trainer's uid): GroupGroup
	// (default: the rollout's group_id, minted per task per enqueue call by
	// the task queue or given at registration, else as GroupTaskPolicy),
	// GroupTask (every selected attempt of a task) or GroupTaskPolicy (task
	// and the policy version of the attempt's first call, so that two
	// training steps of one task, served by different weights, never share a
	// baseline, as verl and Agent Lightning mint a group per step).
	GroupBy string
	// Report, when set, makes Build explain every selected attempt in
	// Result.Report: each call choice and sample included or excluded, with
	// the reason (the Excl* names of Stats.Excluded).
	Report bool
	// Emit, when set, streams the samples instead of returning them in
	// Result.Samples: Build reads the store once and keeps the samples in a
	// spill file (in SpillDir) until the batch-wide advantages are known,
	// so memory stays flat whatever the size of the export; the file holds
	// about the samples' ids, masks and logprobs (at most ≈ 5 bytes per token) and
	// is removed when Build returns.
	Emit func(*Sample) error
	// SpillDir is the folder of Emit's spill file and of every Build's
	// other temporary files: the selection (about 60 bytes per selected
	// attempt) and the sorted runs of the group statistics (about 50 bytes
	// per unit, twice) ("" = os.TempDir()).
	SpillDir string
}

// Progress is how far a Build has come (Options.Progress).
type Progress struct {
	// Phase is PhaseRead while attempts are read and assembled, then, with
	// Emit, PhaseWrite while the samples are handed out.
	Phase                   string
	Attempts, TotalAttempts int // attempts read, of those selected
	Calls                   int // call rows read
	// Samples written (PhaseWrite), of TotalSamples, known when the
	// writing begins.
	Samples, TotalSamples int
}

// Progress phases.
const (
	PhaseRead  = "read"
	PhaseWrite = "write"
)

// MissingReward policies (Options.MissingReward).
const (
	MissingZero      = "0"
	MissingDrop      = "drop"
	MissingDropGroup = "drop-group"
)

// Grouping (Options.GroupBy).
const (
	GroupGroup      = "group"
	GroupTask       = "task"
	GroupTaskPolicy = "task+policy"
)

// Logprobs policies (Options.Logprobs).
const (
	LogprobsKeep = "keep"
	LogprobsOmit = "omit"
)

// Retokenizer rebuilds the token ids of one call choice captured without
// them, from its request body, assistant message and finish reason.
// *chattemplate.Retokenizer (package tokenize/chattemplate) is the
// implementation: the model's chat template and tokenizer.json.
type Retokenizer interface {
	Retokenize(requestBody, responseMessage, finishReason string) (*chattemplate.Retokenized, error)
}

var _ Retokenizer = (*chattemplate.Retokenizer)(nil)
