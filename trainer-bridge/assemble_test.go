package bridge

import (
	"testing"

	"github.com/rollgate/rollgate/export"
)

func TestAssembleBreaks(t *testing.T) {
	c := func(seq uint64, agent string, prompt, resp []uint32) export.Call {
		return export.Call{RolloutID: "r", AttemptID: "a", AgentName: agent, SequenceID: seq, PromptTokenIDs: prompt, ResponseTokenIDs: resp}
	}
	cases := []struct {
		name    string
		calls   []export.Call
		samples int
		breaks  map[string]int
		merged  int
	}{
		{"merge", []export.Call{c(1, "", []uint32{1, 2}, []uint32{3, 4, 5}), c(2, "", []uint32{1, 2, 3, 4, 5, 6}, []uint32{7})}, 1, map[string]int{}, 1},
		// the next prompt drops the response's end-of-turn token (5): template
		{"template", []export.Call{c(1, "", []uint32{1, 2}, []uint32{3, 4, 5}), c(2, "", []uint32{1, 2, 3, 4, 8}, []uint32{7})}, 2, map[string]int{BreakTemplate: 1}, 0},
		// previous prompt kept, response re-tokenized early: retokenization
		{"retoken", []export.Call{c(1, "", []uint32{1, 2}, []uint32{3, 4, 5, 6}), c(2, "", []uint32{1, 2, 9, 9, 9, 9}, []uint32{7})}, 2, map[string]int{BreakRetoken: 1}, 0},
		// the system prompt changed: context edit
		{"context", []export.Call{c(1, "", []uint32{1, 2}, []uint32{3}), c(2, "", []uint32{0, 2, 3}, []uint32{7})}, 2, map[string]int{BreakContext: 1}, 0},
		// another agent's first call is not a break; each agent's turns merge
		{"agents", []export.Call{c(1, "x", []uint32{1}, []uint32{2}), c(2, "y", []uint32{1}, []uint32{5}), c(3, "x", []uint32{1, 2, 3}, []uint32{4}), c(4, "y", []uint32{1, 5, 6}, []uint32{7})}, 2, map[string]int{}, 2},
		// two choices of one request, each continued later: no break
		{"choices", []export.Call{c(1, "", []uint32{1}, []uint32{2}), c(1, "", []uint32{1}, []uint32{3}), c(2, "", []uint32{1, 3, 4}, []uint32{5}), c(3, "", []uint32{1, 3, 4, 5, 6}, []uint32{7})}, 2, map[string]int{}, 2},
	}
	for _, tc := range cases {
		st := Stats{Breaks: map[string]int{}}
		out, err := assemble(ModeTrajectories, tc.calls, &st)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != tc.samples || sp(st.Breaks) != sp(tc.breaks) || st.Merged != tc.merged {
			t.Errorf("%s: %d samples, breaks %v, merged %d", tc.name, len(out), st.Breaks, st.Merged)
		}
	}
	if _, err := assemble("bogus", nil, &Stats{}); err == nil {
		t.Error("bad mode accepted")
	}
}
