package bridge

// TaskStat is the reward distribution of one task's samples.
type TaskStat struct {
	Samples   int
	Mean, Std float64 // population std of sample rewards
}

// Stats summarises a run: what was used, what was left out and why.
type Stats struct {
	Attempts           int            // attempts selected
	Calls              int            // llm_calls rows of the selected attempts
	Samples            int            // samples produced
	Groups             int            // advantage groups (task ids) among the samples
	Merged             int            // trajectory mode: calls merged into an earlier turn's sample
	Trimmed            int            // samples trimmed by TruncTrim (off-policy)
	Truncated          int            // samples whose response was cut at MaxResponse (TruncCut)
	FilledRewards      int            // attempts without an episode reward given 0 (MissingZero)
	DroppedGroups      int            // zero-variance groups dropped
	DroppedSamples     int            // samples of those groups (also in Excluded[zero_variance])
	SmallGroups        int            // groups sampled with fewer than MinGroupSize members
	MinGroupSize       int            // the minimum group size in force (Options.MinGroupSize or the estimator's)
	Retokenized        int            // calls whose ids Options.Retokenize rebuilt (token_source none, or any with RetokenizeAll -> retokenized)
	RetokenizedSamples int            // samples among Samples with token_source retokenized
	Excluded           map[string]int // by reason (Excl* constants)
	// NotSelected counts the attempts with calls that the selection left
	// out, by reason (Skip* constants; "status:running" and the like).
	NotSelected map[string]int
	// UnattributedCalls counts the call rows attributed to no rollout,
	// which no selection includes.
	UnattributedCalls int
	Breaks            map[string]int // trajectory breaks by class (Break* constants)
	AIRHits           map[string]int // AIR reward rows by rule
	Tasks             map[string]TaskStat
}

// Result is what Build returns.
type Result struct {
	Samples []*Sample
	Stats   Stats
	// Report explains every selected attempt (Options.Report), in selection order.
	Report []AttemptReport
}

// AttemptReport says what became of one selected attempt and why.
type AttemptReport struct {
	RolloutID string `json:"rollout_id"`
	AttemptID string `json:"attempt_id"`
	TaskID    string `json:"task_id"`
	Status    string `json:"status"`
	Group     string `json:"group,omitempty"` // the advantage group (uid)
	// Score is the attempt's rollout-level score; RewardMissing says the
	// episode reward was absent (and 0 used, or the attempt dropped).
	Score         float64 `json:"score"`
	RewardMissing bool    `json:"reward_missing,omitempty"`
	// Reason is set when the whole attempt was left out (no_reward,
	// no_sample, small_group, missing_reward_group, zero_variance).
	Reason string `json:"reason,omitempty"`
	// Items are the attempt's call choices left out before assembly and its
	// samples, included or not.
	Items []Decision `json:"items"`
}

// Decision is what became of one call choice (before assembly) or sample.
type Decision struct {
	Kind        string   `json:"kind"` // "call" or "sample"
	SequenceIDs []uint64 `json:"sequence_ids"`
	ChoiceIndex uint32   `json:"choice_index"`
	Included    bool     `json:"included"`
	Reason      string   `json:"reason,omitempty"`
	Truncated   bool     `json:"truncated,omitempty"`
	Advantage   float64  `json:"advantage,omitempty"`
}
