package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	bridge "github.com/rollgate/rollgate/trainer-bridge"
)

// What rollgate bridge says about a batch: the summary on stderr, the
// --report file and the --explain lines.

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
