package bridge

import (
	"fmt"
	"strings"
)

// Hint says, for an exclusion reason (Excl*) or a selection reason
// (Skip*, "status:<s>") counted in Stats, what left the data out and the
// flag, header or call that changes it, so a summary never leaves a user
// guessing why a batch is smaller than the calls they made. minGroup is the
// minimum group size in force (Options.MinGroupSize after defaults; 0 when
// unknown).
func Hint(reason string, minGroup int) string {
	if status, ok := strings.CutPrefix(reason, SkipStatus); ok {
		switch status {
		case StatusUnregistered:
			return "rollouts never registered, not selected by --status: add " + StatusUnregistered + " to --status (selects them once rewarded)"
		case "running", "queued":
			return "attempts not finished yet: report their status (POST /api/v1/rollouts/{id}/status) or select them with --status"
		default:
			return fmt.Sprintf("attempts with status %s: --status selects them (default %s)", status, strings.Join(DefaultStatuses, ","))
		}
	}
	switch reason {
	case SkipTasks:
		return "tasks not named by --tasks"
	case SkipRollouts:
		return "rollouts not named by --rollouts (or completed before --after)"
	case SkipTime:
		return "first call outside --since/--until"
	case SkipUnattributed:
		return "calls without a rollout (no /rollout/{r}/attempt/{a}/v1 path, no x-rollout-id header) are never trained on: use the per-rollout base URL"
	case ExclUnfinished:
		return "rollouts never registered and without an episode reward, perhaps still running: POST /api/v1/rollouts/{id}/rewards {\"value\": ...} when the episode ends, or report its status; --status '' takes them with reward 0"
	case ExclSuperseded:
		return "tries of a call the agent's SDK retried (same sequence id, retry_count) whose later try the agent received: only that try is trained on"
	case ExclErrored:
		return "calls that failed (error or HTTP status >= 300): never trained on"
	case ExclUnverified:
		return "calls without the engine's verified token ids: --retokenize MODEL_DIR rebuilds them from text"
	case ExclRetokenize:
		return "--retokenize could not rebuild their ids: --explain ROLLOUT_ID shows which"
	case ExclAgent:
		return "agent_name does not match --agent"
	case ExclPolicyVersion:
		return "served by a policy older than --min-policy-version"
	case ExclTruncDropped:
		return "over --max-prompt/--max-response with --truncation drop"
	case ExclPromptTooLong:
		return "prompt over --max-prompt: raise it (--truncation trim keeps a cut, off-policy prompt)"
	case ExclMixedPolicy:
		return "tokens sampled by more than one policy version (resumed after a weight update), with --mixed-policy drop: --mixed-policy keep trains them"
	case ExclNoLogprobs:
		return "no sampling logprobs from the engine: --logprobs omit keeps them (batch without rollout_log_probs)"
	case ExclNoReward:
		return "no episode reward, with --missing-reward drop: --missing-reward 0 trains them with reward 0"
	case ExclMissingGroup:
		return "a group member has no episode reward, with --missing-reward drop-group: --missing-reward 0"
	case ExclNoSample:
		return "every call of the attempt was left out (the reasons above): --explain ROLLOUT_ID"
	case ExclSmallGroup:
		n := "the estimator's minimum"
		if minGroup > 0 {
			n = fmt.Sprint(minGroup)
		}
		return "groups of fewer than " + n + " rollouts: send the same x-task-id header on the calls of one task's rollouts (or register them with a group_id) so they share a group; or --min-group-size 1, --estimator none"
	case ExclZeroVariance:
		return "every score of the group is equal, with --drop-zero-variance"
	}
	return ""
}
