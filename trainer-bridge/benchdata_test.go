package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/trainer-bridge/air"
)

// The benchmarks' data modes (ROLLGATE_BENCH_DATA).
const (
	// benchDataDefault: every call has the same 512-token prompt (ids
	// 0..511), 128 response ids 0, logprobs 0 and tiny messages; the
	// figures measured before the agentic mode existed used it.
	benchDataDefault = "default"
	// benchDataAgentic: multi-turn tool-using trajectories (agenticData).
	benchDataAgentic = "agentic"
)

// The agentic data's shape. A prompt of turn 0 is the shared system part
// and the task's part; turn t > 0's prompt is turn t-1's prompt, its
// response and an observation (the tool's result). A response and the
// observation after it add at most agenticGrowth tokens, so turn 4's
// prompt holds at most agenticSystem + agenticTaskMax + 4*agenticGrowth
// (1,504) tokens.
const (
	agenticSeed    = 0x726f6c6c67617465 // "rollgate"
	agenticVocab   = 151643             // Qwen2.5's regular tokens (ids 0..151642)
	agenticSystem  = 320                // system prompt and tool declarations, shared by every rollout
	agenticTaskMin = 160                // the task's user message, shared by a task's rollouts
	agenticTaskMax = 224
	agenticRespMin = 64
	agenticRespMax = 208 // turns that call a tool
	agenticLastMax = 256 // the last turn's answer
	agenticObsMin  = 16
	agenticObsMax  = 112
	agenticGrowth  = 240
	agenticTurns   = 5
	agenticModel   = "Qwen/Qwen2.5-7B-Instruct"
)

// agenticWords make the messages' text: code and prose words, none of which
// (alone or side by side) matches an AIR failure pattern (error, exception,
// traceback, not found, denied, ...), so tool results never count as failed.
var agenticWords = []string{
	"the", "a", "of", "to", "in", "and", "is", "for", "file", "function", "return", "value", "test", "tests",
	"module", "import", "class", "def", "self", "config", "options", "list", "dict", "string", "index",
	"parse", "input", "output", "result", "check", "update", "fix", "the", "line", "lines", "call", "args",
	"path", "src", "main", "util", "handler", "request", "response", "json", "field", "name", "count",
	"let", "me", "look", "at", "now", "then", "so", "this", "that", "should", "we", "need", "change",
	"passed", "ok", "=", "==", "+", "(", ")", "[", "]", "{", "}", "0", "1", "42", "None", "True", "False",
	"len", "range", "for", "if", "else", "print", "assert", "x", "y", "i", "n", "data", "items", "key",
}

// agenticData generates the agentic mode's calls, rollout by rollout: the
// same calls for a rollout whatever was generated before (PCG seeded with
// agenticSeed and the rollout's number).
type agenticData struct {
	pcg *rand.PCG
	rng *rand.Rand
	// sys is the shared system prompt ids; tasks caches each task's
	// turn-0 prompt ids and its system and user messages' JSON.
	sys   []uint32
	tasks map[int]agenticTask
	text  []byte // scratch
}

type agenticTask struct {
	prompt []uint32
	msgs   string // `{"role":"system",...},{"role":"user",...}`
}

func newAgenticData() *agenticData {
	pcg := rand.NewPCG(0, 0)
	g := &agenticData{pcg: pcg, rng: rand.New(pcg), tasks: map[int]agenticTask{}}
	g.seed(4, 0)
	g.sys = g.ids(nil, agenticSystem)
	return g
}

// seed restarts the random stream at (stream, n). Streams: 0 a rollout's
// calls, 1 a task's prompt ids, 2 the system message, 3 a task's user
// message, 4 the system prompt ids.
func (g *agenticData) seed(stream, n uint64) { g.pcg.Seed(agenticSeed^stream<<56, n) }

// ids appends n token ids: density about 1/(id+64) over the vocabulary
// (frequent tokens have low ids, as in a BPE vocabulary; about a third of
// the ids are above 10,000).
func (g *agenticData) ids(dst []uint32, n int) []uint32 {
	const a = 64.0
	lo, span := math.Log(a), math.Log(agenticVocab+a)-math.Log(a)
	for range n {
		id := uint32(math.Exp(lo+g.rng.Float64()*span) - a)
		dst = append(dst, min(id, agenticVocab-1))
	}
	return dst
}

// logprobs appends n sampled tokens' logprobs: 5% exactly 0, 70% between
// -1e-6 and -0.05 (log-uniform), 25% -0.05 - Exp(1) (down to -20).
func (g *agenticData) logprobs(dst []float32, n int) []float32 {
	lo, hi := math.Log(1e-6), math.Log(0.05)
	for range n {
		var lp float64
		switch u := g.rng.Float64(); {
		case u < 0.05:
		case u < 0.75:
			lp = -math.Exp(lo + g.rng.Float64()*(hi-lo))
		default:
			lp = -min(0.05+g.rng.ExpFloat64(), 20)
		}
		dst = append(dst, float32(lp))
	}
	return dst
}

// skewed is a length in [lo, hi], most of them near lo.
func (g *agenticData) skewed(lo, hi int) int {
	u := g.rng.Float64()
	return lo + int(u*u*float64(hi-lo+1))
}

// words appends about n characters of words separated by spaces.
func (g *agenticData) words(dst []byte, n int) []byte {
	for start := len(dst); len(dst)-start < n; {
		if len(dst) > start {
			dst = append(dst, ' ')
		}
		dst = append(dst, agenticWords[g.rng.IntN(len(agenticWords))]...)
	}
	return dst
}

// word is one identifier-like word (for paths).
func (g *agenticData) word() string {
	for {
		if w := agenticWords[g.rng.IntN(len(agenticWords))]; len(w) > 2 {
			return w
		}
	}
}

// agenticTools is the request's tool declarations (about 600 bytes).
const agenticTools = `[{"type":"function","function":{"name":"run_shell","description":"Run a shell command in the repository and return its standard output and standard error.","parameters":{"type":"object","properties":{"command":{"type":"string","description":"the command line"}},"required":["command"]}}},` +
	`{"type":"function","function":{"name":"read_file","description":"Read a file of the repository, fifty lines from a line offset.","parameters":{"type":"object","properties":{"path":{"type":"string"},"offset":{"type":"integer"}},"required":["path"]}}}]`

// task is task k's turn-0 prompt and first messages, made once.
func (g *agenticData) task(k int) agenticTask {
	if t, ok := g.tasks[k]; ok {
		return t
	}
	g.seed(1, uint64(k))
	n := agenticTaskMin + g.rng.IntN(agenticTaskMax-agenticTaskMin+1)
	t := agenticTask{prompt: g.ids(append(make([]uint32, 0, agenticSystem+n), g.sys...), n)}
	g.seed(2, 0) // the system message: the same text for every task
	b := append(g.text[:0], `{"role":"system","content":"You are a coding agent. `...)
	b = g.words(b, 900)
	g.seed(3, uint64(k))
	b = append(b, `"},{"role":"user","content":"Task `...)
	b = strconv.AppendInt(b, int64(k), 10)
	b = append(b, ": "...)
	b = g.words(b, 4*n)
	b = append(b, `"}`...)
	t.msgs, g.text = string(b), b
	g.tasks[k] = t
	return t
}

// rollout appends rollout r's calls (agenticTurns of them, task r%100) to
// calls. The turns' prompts and responses are views of one array per rollout.
func (g *agenticData) rollout(calls []export.Call, r int, ro string) []export.Call {
	task := g.task(r % 100)
	g.seed(0, uint64(r))
	// The lengths first, then one array for the whole conversation.
	var resp, obs [agenticTurns]int
	total := len(task.prompt)
	for t := range agenticTurns {
		if t == agenticTurns-1 {
			resp[t] = g.skewed(agenticRespMin, agenticLastMax)
		} else {
			resp[t] = g.skewed(agenticRespMin, agenticRespMax)
			obs[t] = min(g.skewed(agenticObsMin, agenticObsMax), agenticGrowth-resp[t])
		}
		total += resp[t] + obs[t]
	}
	conv := append(make([]uint32, 0, total), task.prompt...)
	lps := make([]float32, 0, total-len(task.prompt))
	// msgs is the conversation's messages as JSON, comma-separated.
	msgs := append(g.text[:0], task.msgs...)
	for t := range agenticTurns {
		p := len(conv)
		conv = g.ids(conv, resp[t])
		l := len(lps)
		lps = g.logprobs(lps, resp[t])
		req := make([]byte, 0, len(msgs)+len(agenticTools)+160)
		req = append(req, `{"model":"`+agenticModel+`","messages":[`...)
		req = append(req, msgs...)
		req = append(req, `],"tools":`+agenticTools+`,"temperature":1.0,"top_p":1.0,"max_tokens":2048,"logprobs":true}`...)
		m := len(msgs)
		msgs = append(msgs, `,{"role":"assistant","content":"`...)
		finish := "stop"
		if t < agenticTurns-1 {
			// Some reasoning, then a tool call whose arguments name the
			// turn, so that no two calls repeat each other (air_repeat).
			msgs = g.words(msgs, 3*resp[t]-100)
			callID := "call_" + ro + "_" + strconv.Itoa(t)
			msgs = append(msgs, `","tool_calls":[{"id":"`+callID...)
			dir, file := g.word(), g.word()
			if g.rng.IntN(2) == 0 {
				msgs = append(msgs, `","type":"function","function":{"name":"run_shell","arguments":"{\"command\":\"sed -n `...)
				msgs = strconv.AppendInt(msgs, int64(50*t+1), 10)
				msgs = append(msgs, ',')
				msgs = strconv.AppendInt(msgs, int64(50*t+50), 10)
				msgs = append(msgs, "p src/"+dir+"/"+file+`.py\"}"}}]}`...)
			} else {
				msgs = append(msgs, `","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"src/`+dir+"/"+file+`.py\",\"offset\":`...)
				msgs = strconv.AppendInt(msgs, int64(50*t), 10)
				msgs = append(msgs, `}"}}]}`...)
			}
			finish = "tool_calls"
			resMsg := string(msgs[m+1:])
			// The tool's result, in the next turn's prompt.
			conv = g.ids(conv, obs[t])
			msgs = append(msgs, `,{"role":"tool","tool_call_id":"`+callID+`","content":"`...)
			msgs = g.words(msgs, 4*obs[t])
			msgs = append(msgs, `"}`...)
			calls = g.call(calls, r, ro, t, conv[:p:p], conv[p:p+resp[t]:p+resp[t]], lps[l:], string(req), resMsg, finish)
			continue
		}
		msgs = g.words(msgs, 3*resp[t])
		msgs = append(msgs, `"}`...)
		calls = g.call(calls, r, ro, t, conv[:p:p], conv[p:p+resp[t]:p+resp[t]], lps[l:], string(req), string(msgs[m+1:]), finish)
	}
	g.text = msgs
	return calls
}

// call appends one turn's call, with the default mode's other columns and
// what the gateway would also have written (model, endpoint, usage, turn kind).
func (g *agenticData) call(calls []export.Call, r int, ro string, t int, prompt, resp []uint32, lps []float32, req, msg, finish string) []export.Call {
	kind, prefix, prev := "first", 0, uint64(0)
	if t > 0 {
		c := &calls[len(calls)-1]
		kind, prefix, prev = "prefix", len(c.PromptTokenIDs)+len(c.ResponseTokenIDs), c.SequenceID
	}
	return append(calls, export.Call{SpanID: ro + strconv.Itoa(t), RolloutID: ro, AttemptID: "a", TaskID: "t" + strconv.Itoa(r%100),
		SequenceID: uint64(t + 1), StartTimeUnixNano: uint64(r*10 + t), HTTPStatus: 200, TokenSource: export.TokenSourceEngine,
		Endpoint: "/v1/chat/completions", Model: agenticModel, RequestBody: req, ResponseMessage: msg,
		PromptTokenIDs: prompt, ResponseTokenIDs: resp, ResponseLogprobs: lps[:len(resp):len(resp)], FinishReason: finish,
		PromptTokens: uint32(len(prompt)), CompletionTokens: uint32(len(resp)),
		TurnKind: kind, TurnPrefixLen: uint32(prefix), TurnPrevSequenceID: prev})
}

// TestAgenticBenchData checks the agentic benchmark data's invariants, so
// that the generator cannot silently break the benchmarks: deterministic,
// growing prompts (each turn's prompt starts with the previous turn's prompt
// and response), ids in the vocabulary, finite logprobs <= 0, lengths in
// range, valid JSON, no AIR hit, and every call one sample under the
// benchmarks' options.
func TestAgenticBenchData(t *testing.T) {
	const rollouts = 200 // two rollouts per task: GRPO's groups need two
	gen := func() []export.Call {
		g := newAgenticData()
		var calls []export.Call
		for r := range rollouts {
			calls = g.rollout(calls, r, fmt.Sprintf("r%06d", r))
		}
		return calls
	}
	calls := gen()
	if len(calls) != rollouts*agenticTurns {
		t.Fatalf("%d calls", len(calls))
	}
	if !reflect.DeepEqual(calls, gen()) {
		t.Fatal("two generators made different data")
	}
	if one := newAgenticData().rollout(nil, 150, "r000150"); !reflect.DeepEqual(one, calls[150*agenticTurns:151*agenticTurns]) {
		t.Fatal("rollout 150 alone differs from rollout 150 after the others")
	}
	e, err := air.New(air.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	var nIDs, highIDs, nLPs, lowLPs, zeroLPs int
	seen := map[uint32]bool{}
	for r := range rollouts {
		cs := calls[r*agenticTurns : (r+1)*agenticTurns]
		if hits := e.Evaluate(cs, 0); len(hits) > 0 {
			t.Fatalf("rollout %d: AIR hits %v", r, air.Counts(hits))
		}
		if r >= 100 && !slices.Equal(cs[0].PromptTokenIDs, calls[(r-100)*agenticTurns].PromptTokenIDs) {
			t.Fatalf("rollout %d: turn 0's prompt differs from rollout %d's (same task)", r, r-100)
		}
		for i, c := range cs {
			where := fmt.Sprintf("rollout %d turn %d", r, i)
			if c.SequenceID != uint64(i+1) || c.RolloutID != fmt.Sprintf("r%06d", r) || c.TaskID != fmt.Sprint("t", r%100) {
				t.Fatalf("%s: sequence %d, rollout %s, task %s", where, c.SequenceID, c.RolloutID, c.TaskID)
			}
			np, nr := len(c.PromptTokenIDs), len(c.ResponseTokenIDs)
			maxResp := agenticRespMax
			if i == agenticTurns-1 {
				maxResp = agenticLastMax
			}
			if nr < agenticRespMin || nr > maxResp || len(c.ResponseLogprobs) != nr {
				t.Fatalf("%s: %d response ids, %d logprobs", where, nr, len(c.ResponseLogprobs))
			}
			if i == 0 {
				if np < agenticSystem+agenticTaskMin || np > agenticSystem+agenticTaskMax {
					t.Fatalf("%s: %d prompt ids", where, np)
				}
			} else {
				p := cs[i-1]
				prev := append(slices.Clone(p.PromptTokenIDs), p.ResponseTokenIDs...)
				if !slices.Equal(c.PromptTokenIDs[:min(len(prev), np)], prev) {
					t.Fatalf("%s: the prompt does not start with the previous prompt and response", where)
				}
				if obs := np - len(prev); obs < agenticObsMin || obs > agenticObsMax {
					t.Fatalf("%s: %d observation ids", where, obs)
				}
			}
			if np > agenticSystem+agenticTaskMax+4*agenticGrowth {
				t.Fatalf("%s: %d prompt ids", where, np)
			}
			for _, id := range slices.Concat(c.PromptTokenIDs, c.ResponseTokenIDs) {
				if id >= agenticVocab {
					t.Fatalf("%s: id %d", where, id)
				}
				seen[id] = true
				nIDs++
				if id > 10000 {
					highIDs++
				}
			}
			for _, lp := range c.ResponseLogprobs {
				if !(lp <= 0) || math.IsInf(float64(lp), 0) {
					t.Fatalf("%s: logprob %v", where, lp)
				}
				nLPs++
				if lp < -1 {
					lowLPs++
				}
				if lp == 0 {
					zeroLPs++
				}
			}
			var req struct {
				Messages []json.RawMessage `json:"messages"`
			}
			if err := json.Unmarshal([]byte(c.RequestBody), &req); err != nil || len(req.Messages) != 2+2*i {
				t.Fatalf("%s: request %v, %d messages", where, err, len(req.Messages))
			}
			var msg struct {
				Role      string            `json:"role"`
				Content   string            `json:"content"`
				ToolCalls []json.RawMessage `json:"tool_calls"`
			}
			if err := json.Unmarshal([]byte(c.ResponseMessage), &msg); err != nil || msg.Role != "assistant" || len(msg.Content) < 50 {
				t.Fatalf("%s: response message %v %q", where, err, c.ResponseMessage)
			}
			if l := len(msg.ToolCalls); (l == 1) != (i < agenticTurns-1) {
				t.Fatalf("%s: %d tool calls", where, l)
			}
		}
	}
	// The spread the benchmarks are for: ids over the vocabulary, a few
	// unlikely tokens among confident ones.
	if len(seen) < 20000 || highIDs < nIDs/5 || highIDs > nIDs/2 {
		t.Errorf("%d distinct ids, %d of %d above 10,000", len(seen), highIDs, nIDs)
	}
	if lowLPs < nLPs/20 || lowLPs > nLPs/4 || zeroLPs > nLPs/10 {
		t.Errorf("%d of %d logprobs below -1, %d zero", lowLPs, nLPs, zeroLPs)
	}

	s, err := sqlite.Open(filepath.Join(t.TempDir(), "bench.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	benchStore(t, s, rollouts, benchDataAgentic)
	res, err := Build(context.Background(), s, benchOptions())
	if err != nil {
		t.Fatal(err)
	}
	st := res.Stats
	if len(res.Samples) != rollouts*agenticTurns || len(st.Excluded) > 0 || len(st.AIRHits) > 0 || st.Truncated+st.Trimmed > 0 {
		t.Fatalf("%d samples of %d calls; excluded %v, AIR hits %v, truncated %d, trimmed %d", len(res.Samples), len(calls), st.Excluded, st.AIRHits, st.Truncated, st.Trimmed)
	}
}
