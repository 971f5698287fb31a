package tokenin

import (
	"slices"
	"testing"
)

// ChatML-like ids: 1 <|im_start|>, 2 <|im_end|>, 3 "\n", 10+ text.
func TestJoin(t *testing.T) {
	f := func(prev *Prev, closed, full, want []uint32) {
		t.Helper()
		got, ok := Join(nil, prev, 0, closed, full)
		if ok != (want != nil) || !slices.Equal(got, want) {
			t.Fatalf("Join = %v, %v; want %v", got, ok, want)
		}
	}
	prev := &Prev{Prompt: []uint32{1, 10, 11, 2, 3, 1, 20, 3}, Choices: []Choice{{Response: []uint32{30, 31, 2}, Ended: true}}}
	// The template re-renders the answer differently (40 instead of 30 31):
	// the join after <|im_end|> ("\n") and the new message come from full.
	closed := []uint32{1, 10, 11, 2, 3, 1, 20, 3, 40, 2, 3}
	full := []uint32{1, 10, 11, 2, 3, 1, 20, 3, 40, 2, 3, 1, 50, 51, 2, 3, 1, 20, 3}
	f(prev, closed, full, []uint32{1, 10, 11, 2, 3, 1, 20, 3, 30, 31, 2, 3, 1, 50, 51, 2, 3, 1, 20, 3})
	// The join in full is not the one closed renders.
	f(prev, closed, []uint32{1, 10, 11, 2, 3, 1, 20, 3, 40, 2, 9, 1, 50, 2}, nil)
	// The end-of-turn token is not near the end of closed.
	f(prev, append(slices.Clone(closed), 60, 61, 62, 63, 64, 65, 66, 67, 68), full, nil)
	// No new ids after the join.
	f(prev, closed, closed, nil)
	// An answer whose last id the template never renders.
	f(&Prev{Prompt: []uint32{1}, Choices: []Choice{{Response: []uint32{30, 99}}}}, closed, full, nil)
	f(&Prev{}, closed, full, nil)
}

// Llama 3 ids: 1 <|begin_of_text|>, 2 <|start_header_id|>, 3 <|end_header_id|>,
// 4 <|eot_id|>, 5 "\n\n", 6 user, 7 assistant, 8 tool, 10+ text. Its
// template writes the generation prompt even when none is asked for.
func TestJoinTemplateAlwaysOpensATurn(t *testing.T) {
	head := func(role uint32) []uint32 { return []uint32{2, role, 3, 5} }
	cat := func(parts ...[]uint32) []uint32 { return slices.Concat(parts...) }
	prompt := cat([]uint32{1}, head(6), []uint32{10, 4}, head(7))
	prev := &Prev{Prompt: prompt, Choices: []Choice{{Response: []uint32{20, 21, 4}, Ended: true}}}
	closed := cat([]uint32{1}, head(6), []uint32{10, 4}, head(7), []uint32{22, 4}, head(7))
	full := cat([]uint32{1}, head(6), []uint32{10, 4}, head(7), []uint32{22, 4}, head(8), []uint32{30, 4}, head(7))
	got, ok := Join(nil, prev, 0, closed, full)
	want := cat(prompt, []uint32{20, 21, 4}, head(8), []uint32{30, 4}, head(7))
	if !ok || !slices.Equal(got, want) {
		t.Fatalf("Join = %v, %v; want %v", got, ok, want)
	}
}

// A cut answer (no end-of-turn id sampled): JoinCut appends the closing the
// template renders after the sampled ids, only when closed is exactly the
// previous prompt + those ids + the closing.
func TestJoinCut(t *testing.T) {
	prompt := []uint32{1, 10, 11, 2, 3, 1, 20, 3}
	prev := &Prev{Prompt: prompt, Choices: []Choice{{Response: []uint32{30, 31}}}}
	closed := slices.Concat(prompt, []uint32{30, 31, 2, 3})
	full := slices.Concat(prompt, []uint32{30, 31, 2, 3, 1, 50, 2, 3, 1, 20, 3})
	got, ok := JoinCut(nil, prev, 0, closed, full)
	if want := slices.Concat(prompt, []uint32{30, 31, 2, 3, 1, 50, 2, 3, 1, 20, 3}); !ok || !slices.Equal(got, want) {
		t.Fatalf("JoinCut = %v, %v; want %v", got, ok, want)
	}
	// The full rendering re-tokenises the answer (40): the sampled ids stay.
	full2 := slices.Concat(prompt, []uint32{40, 2, 3, 1, 50, 2, 3, 1, 20, 3})
	got, ok = JoinCut(nil, prev, 0, closed, full2)
	if want := slices.Concat(prompt, []uint32{30, 31, 2, 3, 1, 50, 2, 3, 1, 20, 3}); !ok || !slices.Equal(got, want) {
		t.Fatalf("JoinCut with a re-tokenised answer = %v, %v; want %v", got, ok, want)
	}
	// An earlier turn the template renders otherwise (12 for 10: Qwen3
	// drops earlier thinking): the answer's own turn decides.
	other := []uint32{1, 12, 11, 2, 3, 1, 20, 3}
	got, ok = JoinCut(nil, prev, 0, slices.Concat(other, []uint32{30, 31, 2, 3}), slices.Concat(other, []uint32{30, 31, 2, 3, 1, 50, 2, 3, 1, 20, 3}))
	if want := slices.Concat(prompt, []uint32{30, 31, 2, 3, 1, 50, 2, 3, 1, 20, 3}); !ok || !slices.Equal(got, want) {
		t.Fatalf("JoinCut after an earlier turn rendered otherwise = %v, %v; want %v", got, ok, want)
	}
	// Not exact: the answer re-renders to other ids (a stop string cut, a
	// different merge), after another opening, or nothing closes it.
	for name, c := range map[string][]uint32{
		"answer":  slices.Concat(prompt, []uint32{40, 2, 3}),
		"opening": slices.Concat([]uint32{1, 10, 11, 2, 3, 1, 21, 3}, []uint32{30, 31, 2, 3}),
		"nothing": slices.Concat(prompt, []uint32{30, 31}),
	} {
		if got, ok := JoinCut(nil, prev, 0, c, full); ok {
			t.Errorf("%s: JoinCut = %v, want no join", name, got)
		}
	}
}

func TestCheck(t *testing.T) {
	msgs, err := Canonical([]byte(`[{"role":"user","content":"hi"}]`))
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := CanonicalAnswer([]byte(`{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\": 1}"}}],"refusal":null,"reasoning":null}`))
	other, _ := CanonicalAnswer([]byte(`{"role":"assistant","content":"Paris."}`))
	// Two choices (n = 2): the agent sends back the second.
	prev := &Prev{Messages: msgs, RenderKey: "k", Choices: []Choice{{Answer: other, Ended: true}, {Answer: answer, Ended: true}}}
	f := func(next, key, want string) {
		t.Helper()
		m, err := Canonical([]byte(next))
		if err != nil {
			t.Fatal(err)
		}
		i, got := Check(prev, m, key)
		// Choice 1 when it extends or its answer was cut (ReasonNotEnded:
		// JoinCut may join it), -1 otherwise.
		wantI := -1
		if want == "" || want == ReasonNotEnded {
			wantI = 1
		}
		if got != want || i != wantI {
			t.Fatalf("Check(%s) = %d, %q, want %d, %q", next, i, got, wantI, want)
		}
	}
	// The client re-serialises the arguments and drops members: still the answer.
	ext := `[{"content":"hi","role":"user","name":null},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"arguments":"{\"a\":1}","name":"f"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]`
	f(ext, "k", "")
	f(ext, "k2", ReasonTemplate)
	f(`[{"role":"user","content":"hello"},{"role":"assistant","content":""},{"role":"user","content":"x"}]`, "k", ReasonEdited)
	f(`[{"role":"user","content":"hi"},{"role":"assistant","content":"other"},{"role":"user","content":"x"}]`, "k", ReasonAssistant)
	f(`[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"arguments":"{\"a\":1}","name":"f"}}]}]`, "k", ReasonShorter)
	f(`[{"role":"system","content":"new"},{"role":"user","content":"hi"}]`, "k", ReasonEdited)
	prev.Choices[1].Ended = false
	f(ext, "k", ReasonNotEnded)
	// The other choice sent back extends choice 0.
	m, _ := Canonical([]byte(`[{"role":"user","content":"hi"},{"role":"assistant","content":"Paris."},{"role":"user","content":"x"}]`))
	if i, why := Check(prev, m, "k"); i != 0 || why != "" {
		t.Fatalf("the first choice sent back: Check = %d, %q, want 0", i, why)
	}
}

func TestStoreBounds(t *testing.T) {
	evicted := 0
	s := NewStore(2, 1<<20, func() { evicted++ })
	for i, k := range []string{"a", "b", "c"} {
		s.Put(k, &Prev{Prompt: make([]uint32, i+1)})
	}
	if s.Get("a") != nil || s.Get("b") == nil || s.Get("c") == nil || evicted != 1 || s.Len() != 2 {
		t.Fatalf("after 3 puts into 2 entries: len %d, evicted %d", s.Len(), evicted)
	}
	// An entry bigger than the byte budget is not kept.
	small := NewStore(10, 1000, func() { evicted++ })
	small.Put("big", &Prev{Prompt: make([]uint32, 1000)})
	if small.Get("big") != nil || small.Bytes() != 0 || evicted != 2 {
		t.Fatalf("an entry over the budget was kept: %d bytes, evicted %d", small.Bytes(), evicted)
	}
	// Bytes evict the least recently used.
	for i := range 20 {
		small.Put(string(rune('a'+i)), &Prev{Prompt: make([]uint32, 50)})
	}
	if small.Bytes() > 1000 {
		t.Fatalf("%d bytes held, budget 1000", small.Bytes())
	}
}

func FuzzCanonical(f *testing.F) {
	f.Add([]byte(`[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","function":{"name":"f","arguments":"{}"}}]}]`))
	f.Add([]byte(`[1,null,{"tool_calls":[null,{"function":3}]}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs, err := Canonical(b)
		if err != nil {
			return
		}
		// Canonical forms are fixed points and answers compare.
		for _, m := range msgs {
			again, err := Canonical([]byte("[" + m + "]"))
			if err != nil || len(again) != 1 || again[0] != m {
				t.Fatalf("not a fixed point: %s -> %v %v", m, again, err)
			}
			_ = AnswerOf(m)
		}
		_ = RenderKey(b)
	})
}
