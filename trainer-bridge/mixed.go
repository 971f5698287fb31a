package bridge

import (
	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export"
)

// Mixed-policy samples: a response generated partly by one policy and
// partly by another (a generation the gateway aborted for a weight update
// and resumed on the new weights: llm_calls.policy_versions), or a
// trajectory that merges calls served by different policy versions. Their
// rollout_log_probs are each token's sampling policy's, so an off-policy
// correction (importance ratios against the trainer's policy) is exact per
// token; Options.MixedPolicy keeps them (the default: dropping them would
// drop exactly the longest generations, the ones a weight update caught,
// and bias a batch towards short answers) or drops them (ExclMixedPolicy,
// counted per sample).

// Mixed-policy policies (Options.MixedPolicy).
const (
	MixedKeep = "keep"
	MixedDrop = "drop"
)

// callPolicy reads a call's policy_versions: the version that sampled its
// last token and whether more than one version sampled it. Without
// segments (one generation) that is policy_version, not mixed. Segments
// that are not a JSON array of [start, "version"] pairs with starts
// increasing from 0 cannot tell which policy sampled which token: the call
// is taken for mixed.
func callPolicy(c *export.Call) (last string, mixed bool) {
	if c.PolicyVersions == "" {
		return c.PolicyVersion, false
	}
	segs := gjson.Parse(c.PolicyVersions)
	if !segs.IsArray() || !gjson.Valid(c.PolicyVersions) {
		return c.PolicyVersion, true
	}
	prev, n, ok := int64(-1), 0, true
	first := ""
	segs.ForEach(func(_, sg gjson.Result) bool {
		pair := sg.Array()
		if !sg.IsArray() || len(pair) != 2 || pair[0].Type != gjson.Number || pair[1].Type != gjson.String ||
			pair[0].Int() <= prev || (n == 0) != (pair[0].Int() == 0) || float64(pair[0].Int()) != pair[0].Num {
			ok = false
			return false
		}
		prev, last = pair[0].Int(), pair[1].Str
		if n == 0 {
			first = last
		}
		mixed = mixed || last != first
		n++
		return true
	})
	if !ok || n == 0 {
		return c.PolicyVersion, true
	}
	return last, mixed
}
