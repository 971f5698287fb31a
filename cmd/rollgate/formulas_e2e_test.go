package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// formulasCheck is run by Debian's python3 with the rollgate package: it
// loads the bridge's batch and report and recomputes GRPO from
// docs/verl.md §3 over each group as sampled (the report's
// attempt scores, attempts without samples included), independently of the
// Go estimator, and checks the imperfect cases the test set up.
const formulasCheck = `
import json, math, os, sys
import numpy as np
import rollgate

t, nt, meta = rollgate.load_batch(os.environ["BATCH"], backend="numpy")
rep = json.load(open(os.environ["REPORT"]))
want = json.loads(os.environ["WANT"])  # rollout -> expected score
attempts = rep["attempts"]

# Scores: the posted reward, 0 when none was posted (missing reward), also for the failed rollout.
for a in attempts:
    assert abs(a["score"] - want[a["rollout_id"]]) < 1e-9, (a["rollout_id"], a["score"], want[a["rollout_id"]])
assert set(a["rollout_id"] for a in attempts) == set(want), "selected attempts"

# GRPO over every selected attempt of a group (docs/verl.md §3): A = (s - mean) / (std + 1e-6), unbiased std.
groups = {}
for a in attempts:
    groups.setdefault(a["group"], []).append(a["score"])
def grpo(s, g):
    xs = groups[g]
    if len(xs) == 1:
        return s / (1 + 1e-6)
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return (s - m) / (sd + 1e-6)
by_rollout = {a["rollout_id"]: a for a in attempts}
mask = t["response_mask"]
for i, ro in enumerate(nt["rollout_id"]):
    a = by_rollout[ro]
    assert nt["uid"][i] == a["group"], (ro, nt["uid"][i], a["group"])
    expected = grpo(a["score"], a["group"])
    got = t["advantages"][i][mask[i] == 1]
    assert np.allclose(got, expected, atol=1e-5), (ro, got[:3], expected)
    assert np.allclose(t["returns"][i], t["advantages"][i]), "returns = advantages"
    assert np.allclose(t["token_level_scores"][i], t["token_level_rewards"][i]), "rewards = scores"
    assert nt["has_logprobs"][i] is True or nt["has_logprobs"][i] == True

# Two training steps of one task are two groups; one step's rollouts share one.
step = json.loads(os.environ["STEPS"])
g1 = set(by_rollout[r]["group"] for r in step[0])
g2 = set(by_rollout[r]["group"] for r in step[1])
assert len(g1) == 1 and len(g2) == 1 and g1 != g2, (g1, g2)

# The over-long answer is cut at --max-response and kept, marked truncated.
long = os.environ["LONG"]
rows = [i for i, ro in enumerate(nt["rollout_id"]) if ro == long]
assert rows and all(nt["truncated"][i] for i in rows), "truncated flag"
assert all(int(mask[i].sum()) <= int(os.environ["MAXRESP"]) for i in rows)

# The critic's call without logprobs is excluded, and the report says why.
critic = os.environ["CRITIC"]
reasons = [d["reason"] for d in by_rollout[critic]["items"] if not d["included"]]
assert reasons == ["no_logprobs"], reasons
assert by_rollout[os.environ["NOSAMPLE"]]["reason"] == "no_sample"
assert os.environ["NOSAMPLE"] not in set(nt["rollout_id"])
print("formulas ok:", len(nt["rollout_id"]), "rows,", len(groups), "groups")
`

// TestBridgeImperfectRolloutsAgainstFormulas: agents through the real
// gateway and task queue over two training steps of one task — a rollout
// without a reward, a failed one, an over-long answer, a second agent whose
// call carries no logprobs, a rollout left without any sample — then rollgate bridge, then Python recomputing
// the advantages from docs/verl.md's formula with the rollgate package.
func TestBridgeImperfectRolloutsAgainstFormulas(t *testing.T) {
	py := "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import numpy").CombinedOutput(); err != nil {
		t.Fatalf("%s with numpy is required (scripts/test installs python3-torch): %v\n%s", py, err, out)
	}
	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "r.db")
	cmd, logs := start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db)
	api := "http://" + addr + "/api/v1"
	enqueue := func(n int) {
		var ts []string
		for range n {
			ts = append(ts, `{"task_id":"T","input":{}}`)
		}
		if s, b, _ := post(t, api+"/tasks", "["+strings.Join(ts, ",")+"]"); s != 200 {
			t.Fatalf("enqueue: %d %s", s, b)
		}
	}
	call := func(base, agent, body string, headers ...string) {
		req := `{"model":"mock-model","messages":[{"role":"user","content":"hi"}]` + body + `}`
		hreq, _ := http.NewRequest("POST", base+"/chat/completions", strings.NewReader(req))
		hreq.Header.Set("Content-Type", "application/json")
		hreq.Header.Set("x-agent-name", agent)
		for i := 0; i+1 < len(headers); i += 2 {
			hreq.Header.Set(headers[i], headers[i+1])
		}
		r, err := http.DefaultClient.Do(hreq)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != 200 {
			t.Fatalf("call: %d %s", r.StatusCode, b)
		}
	}
	type rollout struct{ id, attempt, base string }
	dequeue := func() rollout {
		s, b, _ := post(t, api+"/tasks/dequeue", `{"worker_id":"w"}`)
		if s != 200 {
			t.Fatalf("dequeue: %d %s", s, b)
		}
		g := gjson.Parse(b)
		return rollout{g.Get("rollout_id").String(), g.Get("attempt_id").String(), g.Get("base_url").String()}
	}
	finish := func(r rollout, reward *float64, status string) {
		if reward != nil {
			if s, b, _ := post(t, api+"/rollouts/"+r.id+"/rewards", fmt.Sprintf(`{"value":%v,"attempt_id":%q}`, *reward, r.attempt)); s != 200 {
				t.Fatalf("reward: %d %s", s, b)
			}
		}
		if s, b, _ := post(t, api+"/rollouts/"+r.id+"/status", fmt.Sprintf(`{"status":%q,"attempt_id":%q,"worker_id":"w"}`, status, r.attempt)); s != 200 {
			t.Fatalf("status: %d %s", s, b)
		}
	}
	f := func(v float64) *float64 { return &v }
	want := map[string]float64{}
	var steps [2][]string
	const maxResp = 20 // the mock answers 16 tokens unless told otherwise

	// Step 1: four rollouts of T.
	enqueue(4)
	r0, r1, r2, r3 := dequeue(), dequeue(), dequeue(), dequeue()
	call(r0.base, "solver", "")
	finish(r0, f(1), "succeeded")
	call(r1.base, "solver", "")
	call(r1.base, "critic", `,"logprobs":false`) // the client refuses logprobs: no_logprobs
	finish(r1, f(0.5), "succeeded")
	call(r2.base, "solver", `,"max_tokens":40`, "x-mock-tokens", "40") // over --max-response: cut
	finish(r2, f(0.25), "succeeded")
	call(r3.base, "solver", "")
	finish(r3, nil, "failed") // failed, no reward: trained with 0
	want[r0.id], want[r1.id], want[r2.id], want[r3.id] = 1, 0.5, 0.25, 0
	steps[0] = []string{r0.id, r1.id, r2.id, r3.id}
	// Step 2: three more rollouts of T, one without a reward, one whose only
	// call has no logprobs (no sample, but its score stays in the baseline).
	enqueue(3)
	r4, r5, r6 := dequeue(), dequeue(), dequeue()
	call(r4.base, "solver", "")
	finish(r4, nil, "succeeded") // no reward: 0
	call(r5.base, "solver", "")
	finish(r5, f(2), "succeeded")
	call(r6.base, "critic", `,"logprobs":false`)
	finish(r6, f(0.75), "succeeded")
	want[r4.id], want[r5.id], want[r6.id] = 0, 2, 0.75
	steps[1] = []string{r4.id, r5.id, r6.id}
	stop(t, cmd, logs)

	dir := t.TempDir()
	batch, report := filepath.Join(dir, "b.safetensors"), filepath.Join(dir, "report.json")
	out := runCmd(t, "bridge", "--db", db, "--estimator", "grpo", "--air=false", "--max-response", fmt.Sprint(maxResp),
		"--out", batch, "--report", report)
	for _, w := range []string{"no_logprobs=2", "no_sample=1", "2 attempts without a reward given 0", "truncated 1 responses"} {
		if !strings.Contains(out, w) {
			t.Fatalf("bridge summary lacks %q:\n%s", w, out)
		}
	}
	wantJSON, _ := json.Marshal(want)
	stepsJSON, _ := json.Marshal(steps)
	pkg, err := filepath.Abs(filepath.Join("..", "..", "python"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	py3 := exec.CommandContext(ctx, py, "-c", formulasCheck)
	py3.Env = append(os.Environ(), "PYTHONPATH="+pkg, "PYTHONDONTWRITEBYTECODE=1", "BATCH="+batch, "REPORT="+report,
		"WANT="+string(wantJSON), "STEPS="+string(stepsJSON), "LONG="+r2.id, "CRITIC="+r1.id, "NOSAMPLE="+r6.id, fmt.Sprint("MAXRESP=", maxResp))
	res, err := py3.CombinedOutput()
	if err != nil || !strings.Contains(string(res), "formulas ok") {
		t.Fatalf("python check: %v\n%s\nbridge:\n%s", err, res, out)
	}
	t.Log(strings.TrimSpace(string(res)))
}
