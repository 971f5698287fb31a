package mock

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// chatOf is a chat request body with these (role, content) messages.
func chatOf(t *testing.T, extra string, msgs ...string) string {
	t.Helper()
	type m struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var ms []m
	for i := 0; i+1 < len(msgs); i += 2 {
		ms = append(ms, m{msgs[i], msgs[i+1]})
	}
	b, err := json.Marshal(ms)
	if err != nil {
		t.Fatal(err)
	}
	return `{"model":"m","max_tokens":8,"messages":` + string(b) + extra + `}`
}

// usageOf returns (prompt tokens, cached tokens, whether details were sent).
func usageOf(u gjson.Result) (prompt, cached int, details bool) {
	d := u.Get("prompt_tokens_details") // null when nothing was cached, as vLLM 0.32.0 writes it
	return int(u.Get("prompt_tokens").Int()), int(d.Get("cached_tokens").Int()), d.Exists() && d.Type != gjson.Null
}

// TestPrefixCacheServesLaterTurns: a multi-turn conversation resent each
// turn is served from the cache after the first turn, in whole blocks, never
// the last prompt token; the counters and /metrics add up.
func TestPrefixCacheServesLaterTurns(t *testing.T) {
	s, base := startT(t, Config{PrefixCacheBlocks: 1024})
	system := strings.Repeat("You are a careful agent; think step by step. ", 20)
	conv := []string{"system", system, "user", "Find the weather in Paris."}
	var queries, hits int
	prevPrompt := 0
	for turn := range 4 {
		body := mustOK(t, post(t, base+"/chat/completions", chatOf(t, "", conv...)))
		prompt, cached, details := usageOf(body.Get("usage"))
		queries += prompt
		hits += cached
		switch {
		case turn == 0 && details:
			t.Fatalf("turn 0: cold cache reported %s", body.Get("usage").Raw)
		case turn > 0 && (cached%PrefixBlockSize != 0 || cached > prompt-1):
			t.Fatalf("turn %d: %d cached of %d prompt tokens: want whole blocks of %d, below the prompt", turn, cached, prompt, PrefixBlockSize)
		case turn > 0 && cached < (prevPrompt/PrefixBlockSize-1)*PrefixBlockSize:
			t.Fatalf("turn %d: %d cached tokens, want about the previous turn's %d prompt tokens", turn, cached, prevPrompt)
		}
		prevPrompt = prompt
		conv = append(conv, "assistant", body.Get("choices.0.message.content").String(), "user", "And then?")
	}
	// The same request again: every whole block but the one holding the last token.
	req := chatOf(t, "", conv...)
	first := mustOK(t, post(t, base+"/chat/completions", req))
	prompt, _, _ := usageOf(first.Get("usage"))
	again := mustOK(t, post(t, base+"/chat/completions", req))
	if _, cached, _ := usageOf(again.Get("usage")); cached != (prompt-1)/PrefixBlockSize*PrefixBlockSize {
		t.Fatalf("repeated request of %d tokens: %d cached, want %d", prompt, cached, (prompt-1)/PrefixBlockSize*PrefixBlockSize)
	}
	_, c1, _ := usageOf(first.Get("usage"))
	_, c2, _ := usageOf(again.Get("usage"))
	queries += 2 * prompt
	hits += c1 + c2

	// A stream with include_usage reports it too.
	sr := post(t, base+"/chat/completions", chatOf(t, `,"stream":true,"stream_options":{"include_usage":true}`, conv...))
	evs := parseSSE(t, sr.body)
	u := gjson.Parse(evs[len(evs)-2].data).Get("usage")
	if p, cached, _ := usageOf(u); p != prompt || cached != (prompt-1)/PrefixBlockSize*PrefixBlockSize {
		t.Fatalf("stream usage %s, want the repeated request's cached tokens", u.Raw)
	}
	queries += prompt
	hits += (prompt - 1) / PrefixBlockSize * PrefixBlockSize

	if int(s.PrefixCacheQueries()) != queries || int(s.PrefixCacheHits()) != hits {
		t.Fatalf("counters: %d queried, %d hit; the answers say %d, %d", s.PrefixCacheQueries(), s.PrefixCacheHits(), queries, hits)
	}
	m := do(t, "GET", strings.TrimSuffix(base, "/v1")+"/metrics", "")
	for _, want := range []string{
		`vllm:prefix_cache_queries_total{model_name="mock-model"} ` + itoa(queries),
		`vllm:prefix_cache_hits_total{model_name="mock-model"} ` + itoa(hits),
	} {
		if !strings.Contains(string(m.body), want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, m.body)
		}
	}

	// Another conversation shares no block.
	other := mustOK(t, post(t, base+"/chat/completions", chatOf(t, "", "system", "Something else entirely.", "user", "Hello")))
	if _, cached, details := usageOf(other.Get("usage")); cached != 0 || details {
		t.Fatalf("unrelated prompt: %s", other.Get("usage").Raw)
	}
	// POST /reset_prefix_cache empties it, as in vLLM.
	if r := post(t, strings.TrimSuffix(base, "/v1")+"/reset_prefix_cache", ""); r.status != 200 {
		t.Fatalf("reset: %d %s", r.status, r.body)
	}
	if _, cached, _ := usageOf(mustOK(t, post(t, base+"/chat/completions", req)).Get("usage")); cached != 0 {
		t.Fatalf("after reset: %d cached", cached)
	}
}

// TestPrefixCacheEvictsLeastRecentlyUsed: a bounded cache keeps the blocks
// used last; a prefix whose first block was evicted hits nothing.
func TestPrefixCacheEvictsLeastRecentlyUsed(t *testing.T) {
	c := newPrefixCache(4)
	seq := func(start, n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(start + i)
		}
		return out
	}
	a := seq(0, 3*PrefixBlockSize+1) // 3 whole blocks
	b := seq(1000, 2*PrefixBlockSize+1)
	if c.lookup(a) != 0 || c.lookup(b) != 0 {
		t.Fatal("cold cache hit")
	}
	// 5 blocks were inserted into 4: a's first block went first.
	if got := c.lookup(a); got != 0 {
		t.Fatalf("a after its first block was evicted: %d cached, want 0", got)
	}
	// That lookup put a's blocks back (evicting b's): now a hits whole.
	if got := c.lookup(a); got != 3*PrefixBlockSize {
		t.Fatalf("a again: %d cached, want %d", got, 3*PrefixBlockSize)
	}
	if len(c.index) != 4 || len(c.entries) != 4 {
		t.Fatalf("cache holds %d blocks (%d entries), want its 4", len(c.index), len(c.entries))
	}
}

// TestPrefillTimeCountsUncachedTokens: time to first token grows by
// PrefillPerToken per prompt token not served from the cache (checked on
// the plan, not timed), and not at all with the model off.
func TestPrefillTimeCountsUncachedTokens(t *testing.T) {
	f := func(cfg Config, prompt []uint32, wantTTFT time.Duration) {
		t.Helper()
		s := New(cfg)
		p := acquirePlan(s, &knobs{ttft: cfg.TTFT})
		defer p.release()
		p.prompts = append(p.prompts, prompt...)
		p.endPrompt()
		p.prefill()
		if p.k.ttft != wantTTFT {
			t.Fatalf("%+v: ttft %v, want %v (cached %d)", cfg, p.k.ttft, wantTTFT, p.cached)
		}
	}
	ids := make([]uint32, 5*PrefixBlockSize+3)
	for i := range ids {
		ids[i] = uint32(i)
	}
	on := Config{PrefixCacheBlocks: 64, PrefillPerToken: time.Microsecond, TTFT: time.Millisecond}
	s := New(on)
	f(Config{TTFT: time.Millisecond}, ids, time.Millisecond) // off: unchanged
	f(Config{PrefillPerToken: time.Microsecond}, ids, time.Duration(len(ids))*time.Microsecond)
	// Cold, then warm on the same server: 5 whole blocks served.
	for i, cached := range []int{0, 5 * PrefixBlockSize} {
		p := acquirePlan(s, &knobs{ttft: on.TTFT})
		p.prompts = append(p.prompts, ids...)
		p.endPrompt()
		p.prefill()
		if want := on.TTFT + time.Duration(len(ids)-cached)*time.Microsecond; p.k.ttft != want || p.cached != cached {
			t.Fatalf("request %d: ttft %v cached %d, want %v and %d", i, p.k.ttft, p.cached, want, cached)
		}
		p.release()
	}
}
