package ui

import (
	"testing"

	"github.com/rollgate/rollgate/export"
)

// TestRolloutPageRetries: the tries of one call (same sequence id) are not
// counted as its choices; the retry says which try it is.
func TestRolloutPageRetries(t *testing.T) {
	req := `{"messages":[{"role":"user","content":"q"}]}`
	page := []export.Call{
		{SpanID: "s0", SequenceID: 1, HTTPStatus: 499, Error: "client disconnected before the response", RequestBody: req},
		{SpanID: "s1", SequenceID: 1, RetryCount: 1, RetryOf: "s0", HTTPStatus: 200, RequestBody: req},
		{SpanID: "s1", SequenceID: 1, RetryCount: 1, RetryOf: "s0", ChoiceIndex: 1, HTTPStatus: 200, RequestBody: req},
	}
	var p rolloutPage
	fillRolloutPage(&p, nil, page, nil, nil)
	if len(p.Calls) != 2 {
		t.Fatalf("%d calls shown, want the 2 tries", len(p.Calls))
	}
	if p.Calls[0].OtherChoices != 0 || p.Calls[1].OtherChoices != 1 || p.Calls[1].RetryCount != 1 || p.Calls[0].OK || !p.Calls[1].OK {
		t.Errorf("tries shown as %+v / %+v", p.Calls[0], p.Calls[1])
	}
}
