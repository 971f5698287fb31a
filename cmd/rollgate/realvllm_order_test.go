package main

import (
	"strings"
	"testing"
)

// TestSameChoiceStreams checks the comparison TestRealVLLM falls back on
// when the engine interleaves a stream's choices otherwise than on the
// direct call: each choice's chunks must be the direct call's, in the
// order the engine sent them on the client's own call.
func TestSameChoiceStreams(t *testing.T) {
	ev := func(i int, text string) string {
		return `data: {"choices":[{"index":` + string(rune('0'+i)) + `,"delta":{"content":"` + text + `"}}]}`
	}
	stream := func(events ...string) []byte {
		return []byte(strings.Join(append(events, "data: [DONE]"), "\n\n") + "\n\n")
	}
	direct := stream(ev(0, "a"), ev(0, "b"), ev(1, "x"), ev(1, "y"))
	got := stream(ev(0, "a"), ev(1, "x"), ev(0, "b"), ev(1, "y"))
	withIDs := func(e string) string { return strings.Replace(e, `"delta"`, `"token_ids":[1],"delta"`, 1) }
	engine := stream(withIDs(ev(0, "a")), withIDs(ev(1, "x")), withIDs(ev(0, "b")), withIDs(ev(1, "y")))

	if same, err := sameChoiceStreams(direct, got, engine); !same || err != nil {
		t.Errorf("the engine's interleaving, each choice's chunks the direct call's: same %v, err %v", same, err)
	}
	// rollgate reordering what the engine sent is an error.
	reordered := stream(withIDs(ev(0, "a")), withIDs(ev(0, "b")), withIDs(ev(1, "x")), withIDs(ev(1, "y")))
	if _, err := sameChoiceStreams(direct, got, reordered); err == nil {
		t.Error("a client order other than the engine's was accepted")
	}
	// A chunk that differs from the direct call's, or one cut otherwise.
	changed := stream(ev(0, "a"), ev(1, "x"), ev(0, "B"), ev(1, "y"))
	if same, err := sameChoiceStreams(direct, changed, engine); same || err != nil {
		t.Errorf("a changed chunk: same %v, err %v", same, err)
	}
	// An extra event beyond the choices' chunks.
	extra := []byte(strings.Replace(string(got), "data: [DONE]", `data: {"choices":[],"usage":{}}`+"\n\ndata: [DONE]", 1))
	if same, _ := sameChoiceStreams(direct, extra, engine); same {
		t.Error("an extra usage event was accepted")
	}
}
