package ui

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/export"
)

// Training view limits: ?steps= is at most maxTrainingSteps per axis.
const (
	defaultTrainingSteps = 40
	maxTrainingSteps     = 500
)

// trainingForm is the training view's query string.
type trainingForm struct {
	Rollout      string // the search box: a rollout id
	Since, Until string // as typed (parseTime)
	Steps        int
	since, until uint64
}

// trainingStep is one step of an axis as the page shows it.
type trainingStep struct {
	export.TrainingStep
	Label     string // the policy version, group id or "task …"
	Link      string // a viewer path (escaped by the template)
	Kind      string // "policy", "group" or "task"
	Cmd       string // the rollgate bridge command for it, "" when none can be written
	Note      string // why there is no command
	Mean, Std string
	Verified  string // share of the successful calls with verified ids
}

// trainingAxis is one axis of the view: its steps, oldest first, and charts.
type trainingAxis struct {
	ID, Title, Explain string
	Steps              []trainingStep
	Charts             []chart
	Full               bool // as many steps as asked: older ones are not shown
}

// searchResult is what the search box found.
type searchResult struct {
	ID      string
	Found   bool
	Groups  []string // the group of each attempt, once each
	Tasks   []string
	Cmd     string
	Calls   bool // it has calls (unregistered rollouts have only calls)
	Message string
}

// trainingPage is the training template's data.
type trainingPage struct {
	F       trainingForm
	Search  *searchResult
	Axes    []trainingAxis
	Elapsed string
}

// parseTrainingForm reads and checks the query string.
func parseTrainingForm(a *fasthttp.Args) (trainingForm, error) {
	f := trainingForm{Rollout: strings.TrimSpace(string(a.Peek("rollout"))), Steps: defaultTrainingSteps}
	if err := checkValue("rollout", f.Rollout); err != nil {
		return f, err
	}
	var err error
	if f.Since, f.Until, f.since, f.until, err = parseWindow(a); err != nil {
		return f, err
	}
	if f.until != 0 && f.until <= f.since {
		return f, errors.New("until must be after since")
	}
	if s := a.Peek("steps"); len(s) > 0 {
		n, err := strconv.Atoi(string(s))
		if err != nil || n < 1 || n > maxTrainingSteps {
			return f, fmt.Errorf("steps must be a whole number from 1 to %d", maxTrainingSteps)
		}
		f.Steps = n
	}
	return f, nil
}

// serveTraining serves the training view: per policy version and per group
// in time order, the mean reward and its spread, calls and tokens, the
// share of verified token ids and what the trainer bridge's defaults leave
// out, drawn as SVG charts from two aggregate reads of the store (one row
// per step, at most ?steps= per axis); a search box for rollout ids; the
// rollgate bridge command of each step.
func (s *Server) serveTraining(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	f, err := parseTrainingForm(ctx.QueryArgs())
	if err != nil {
		s.fail(ctx, fasthttp.StatusBadRequest, "Bad training view option: "+err.Error()+".")
		return
	}
	qctx, cancel := s.queryCtx(ctx)
	defer cancel()
	p := trainingPage{F: f}
	if f.Rollout != "" {
		sr, err := s.searchRollout(qctx, f.Rollout)
		if err != nil {
			s.storeFailed(ctx, "rollout search", err)
			return
		}
		p.Search = sr
	}
	for _, by := range []string{export.TrainingByPolicy, export.TrainingByGroup} {
		steps, err := s.store.TrainingSteps(qctx, export.TrainingQuery{By: by, Since: f.since, Until: f.until, Limit: f.Steps})
		if err != nil {
			s.storeFailed(ctx, "training steps", err)
			return
		}
		p.Axes = append(p.Axes, s.trainingAxis(by, steps, f.Steps))
	}
	p.Elapsed = time.Since(start).Round(time.Millisecond).String()
	s.render(ctx, fasthttp.StatusOK, "training", "Training", p)
}

// searchRollout looks a rollout id up: its attempts' groups and tasks (the
// rollouts table), or, for a rollout never registered, one of its calls.
func (s *Server) searchRollout(ctx context.Context, id string) (*searchResult, error) {
	r := &searchResult{ID: id}
	d, err := s.store.ReadRollout(ctx, id, export.ReadOptions{NoCalls: true})
	if err != nil {
		return nil, err
	}
	for _, a := range d.Attempts {
		if a.GroupID != "" && !slices.Contains(r.Groups, a.GroupID) {
			r.Groups = append(r.Groups, a.GroupID)
		}
		if a.TaskID != "" && !slices.Contains(r.Tasks, a.TaskID) {
			r.Tasks = append(r.Tasks, a.TaskID)
		}
	}
	calls, err := s.store.Calls(ctx, export.CallFilter{RolloutID: id, Limit: 1, Omit: export.ReadOptions{NoRequestBody: true, NoResponseBody: true}})
	if err != nil {
		return nil, err
	}
	r.Calls = len(calls) > 0
	r.Found = len(d.Attempts) > 0 || r.Calls
	if !r.Found {
		r.Message = "No rollout has this id: ids are matched exactly (the rollout list filters by task, group and time)."
		return r, nil
	}
	if r.Calls && len(r.Tasks) == 0 && calls[0].TaskID != "" {
		r.Tasks = append(r.Tasks, calls[0].TaskID)
	}
	r.Cmd, r.Message = s.bridgeCmd("--rollouts", []string{id})
	return r, nil
}

// trainingAxis turns one axis's steps (latest first) into the page's rows
// and charts (oldest first).
func (s *Server) trainingAxis(by string, steps []export.TrainingStep, limit int) trainingAxis {
	ax := trainingAxis{ID: by, Full: len(steps) >= limit}
	if by == export.TrainingByPolicy {
		ax.Title = "By policy version"
		ax.Explain = "Each attempt counts under the policy version that served its first call (the bridge's task+policy grouping uses the same)."
	} else {
		ax.Title = "By group, in time order"
		ax.Explain = "A group is a training step of one task (the rollouts' group_id, the trainer's uid); rollouts without a group_id are shown by task."
	}
	n := len(steps)
	ax.Steps = make([]trainingStep, n)
	for i, st := range steps {
		ax.Steps[n-1-i] = s.stepRow(by, st)
	}
	labels := make([]string, n)
	mean, std, lo, hi := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	calls, prompt, completion, verified := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	unfinished, noReward, small, errored, unverified := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	for i, st := range ax.Steps {
		labels[i] = st.Label
		mean[i], std[i], lo[i], hi[i] = st.RewardMean(), st.RewardStd(), st.RewardMin, st.RewardMax
		calls[i], prompt[i], completion[i] = float64(st.Calls), float64(st.PromptTokens), float64(st.CompletionTokens)
		if ok := st.Calls - st.FailedCalls; ok > 0 {
			verified[i] = round4(float64(st.VerifiedCalls) * 100 / float64(ok))
		}
		finished := st.Succeeded + st.Failed
		unfinished[i] = float64(st.Attempts - finished)
		noReward[i] = float64(st.FinishedNoReward)
		if by == export.TrainingByGroup && finished == 1 {
			small[i] = 1
		}
		errored[i] = float64(st.FailedCalls)
		unverified[i] = float64(st.Calls - st.FailedCalls - st.VerifiedCalls)
	}
	id := func(name string) string { return by + "-" + name }
	ax.Charts = []chart{
		rewardChart(id("reward"), "Episode reward: mean ± standard deviation", labels, mean, std, lo, hi),
		barChart(id("calls"), "Calls", labels, []series{{"calls", "c-calls", calls}}, "", 0),
		barChart(id("tokens"), "Tokens (prompt + completion)", labels, []series{{"prompt", "c-prompt", prompt}, {"completion", "c-completion", completion}}, "", 0),
		barChart(id("verified"), "Verified token ids (share of successful calls)", labels, []series{{"verified", "c-verified", verified}}, "%", 100),
	}
	attempts := []series{{"not finished (status)", "c-unfinished", unfinished}, {"no reward (0 used)", "c-noreward", noReward}}
	if by == export.TrainingByGroup {
		attempts = append(attempts, series{"small group", "c-small", small})
	}
	ax.Charts = append(ax.Charts,
		barChart(id("excluded-attempts"), "Attempts the bridge leaves out or fills (estimate)", labels, attempts, "", 0),
		barChart(id("excluded-calls"), "Calls the bridge leaves out (estimate)", labels, []series{{"errored", "c-errored", errored}, {"unverified_ids", "c-unverified", unverified}}, "", 0))
	return ax
}

// stepRow is one step's row: its label, link and bridge command.
func (s *Server) stepRow(by string, st export.TrainingStep) trainingStep {
	r := trainingStep{TrainingStep: st}
	window := []any{"--since", u64(st.FirstStart), "--until", u64(st.LastStart + 1)}
	switch {
	case by == export.TrainingByPolicy:
		r.Kind, r.Label = "policy", st.PolicyVersion
		if r.Label == "" {
			r.Label = "(none)"
			r.Link = "/ui/rollouts"
			r.Cmd, r.Note = s.bridgeCmd(window...)
		} else {
			r.Link = "/ui/rollouts?policy=" + url.QueryEscape(st.PolicyVersion)
			r.Cmd, r.Note = s.bridgeCmd(append(window, "--min-policy-version", st.PolicyVersion)...)
		}
	case st.GroupID != "":
		r.Kind, r.Label = "group", st.GroupID
		r.Link = "/ui/groups/" + url.PathEscape(st.GroupID)
		r.Cmd, r.Note = s.bridgeCmd(append(window, "--tasks", []string{st.TaskID})...)
	default:
		r.Kind, r.Label = "task", "task "+st.TaskID
		r.Link = "/ui/rollouts?task=" + url.QueryEscape(st.TaskID)
		r.Cmd, r.Note = s.bridgeCmd(append(window, "--tasks", []string{st.TaskID}, "--group-by", "task+policy")...)
	}
	if st.Rewarded > 0 {
		r.Mean, r.Std = fmtFloat(round4(st.RewardMean())), fmtFloat(round4(st.RewardStd()))
	}
	if ok := st.Calls - st.FailedCalls; ok > 0 {
		r.Verified = strconv.Itoa(percent(st.VerifiedCalls, ok)) + "%"
	}
	return r
}

// bridgeStore is the store flag of the bridge commands the viewer shows:
// the embedded store's path, or ClickHouse's DSN from the environment
// (never the DSN itself: it may hold a password).
func (s *Server) bridgeStore() []string {
	if p, ok := s.store.(interface{ Path() string }); ok && p.Path() != "" {
		return []string{"--db", shellQuote(p.Path())}
	}
	return []string{"--clickhouse", `"$ROLLGATE_CLICKHOUSE"`}
}

// bridgeCmd renders `rollgate bridge` with the store flag, args (flag,
// value pairs, quoted for a POSIX shell; a nil value puts the flag alone)
// and an output file, or a note why
// it cannot: an id with a comma for a comma-separated flag (--tasks,
// --rollouts: their values are given as lists).
func (s *Server) bridgeCmd(args ...any) (string, string) {
	parts := append([]string{"rollgate", "bridge"}, s.bridgeStore()...)
	for i := 0; i+1 < len(args); i += 2 {
		flag, _ := args[i].(string)
		var val string
		switch v := args[i+1].(type) {
		case string:
			val = v
		case nil: // a flag alone ("--air=false")
			parts = append(parts, flag)
			continue
		case []string:
			if slices.ContainsFunc(v, func(id string) bool { return strings.Contains(id, ",") }) {
				return "", "no bridge command: " + flag + " takes a comma-separated list and an id here contains a comma"
			}
			val = strings.Join(v, ",")
		}
		parts = append(parts, flag, shellQuote(val))
	}
	return strings.Join(append(parts, "--out", "batch.parquet"), " "), ""
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_./:=@%+,-]+$`)

// shellQuote quotes s for a POSIX shell: as is when it holds only safe
// characters, else in single quotes.
func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
