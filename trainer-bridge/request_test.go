package bridge

import (
	"errors"
	"slices"
	"testing"

	"github.com/rollgate/rollgate/trainer-bridge/advantage"
	"github.com/rollgate/rollgate/trainer-bridge/air"
)

// TestRequestOptions: the defaults of an empty request, the AIR options,
// and that every bad value is an *OptionError naming the flag.
func TestRequestOptions(t *testing.T) {
	o, err := (&Request{}).Options()
	if err != nil {
		t.Fatal(err)
	}
	if o.Estimator != advantage.GRPO || o.Gamma != 1 || o.AIR == nil || !slices.Equal(o.Selection.Statuses, []string{"succeeded", "failed", "unregistered"}) {
		t.Fatalf("defaults: %+v", o)
	}
	off := false
	if o, err = (&Request{AIR: &off, Statuses: []string{}}).Options(); err != nil || o.AIR != nil || len(o.Selection.Statuses) != 0 {
		t.Fatalf("AIR off, any status: %+v %v", o, err)
	}
	if o, err = (&Request{AIRRules: []string{"air_repeat=off"}, AIRMinRepeats: 3}).Options(); err != nil || o.AIR.Enabled(air.RuleRepeat) {
		t.Fatalf("air_repeat=off: %v", err)
	}
	for _, bad := range []Request{
		{Estimator: "gae"}, {Credit: "sometimes"}, {Agent: "("}, {Logprobs: "zeros"},
		{AIRRules: []string{"nope=1"}}, {AIRRules: []string{"air_repeat"}}, {AIRFailurePatterns: []string{"("}}, {AIRMinRepeats: -1},
	} {
		_, err := bad.Options()
		var oe *OptionError
		if !errors.As(err, &oe) {
			t.Errorf("%+v: %v, want an *OptionError", bad, err)
		}
	}
}
