package export

import (
	"context"
	"testing"
)

// TestCallChecksCountsIDs: CallChecks counts the response token ids of the
// text both stores render arrays as, and says so when a value is not an
// array of ids (moved from bench/load's TestCountArray with the counting).
func TestCallChecksCountsIDs(t *testing.T) {
	for in, want := range map[string]int{"[]": 0, "[ ]": 0, "[7]": 1, "[1,2,3]": 3, "": -1, "null": -1, "[1,2": -1} {
		r := NewSQLReads(func(_ context.Context, _ string, args []any, f func([]string) error) error {
			if len(args) != 2 || args[0] != "run-" || args[1] != "run." {
				t.Errorf("args %v, want the range's bounds", args)
			}
			return f([]string{"s", "run-1", "a", "1", "engine", "", "3", in})
		}, "", "IN", "")
		got, err := r.CallChecks(context.Background(), RolloutRange{From: "run-", To: "run."})
		switch {
		case want < 0 && err == nil:
			t.Errorf("%q: counted %+v, want an error", in, got)
		case want >= 0 && (err != nil || len(got) != 1 || got[0].ResponseTokens != want):
			t.Errorf("%q: %+v, %v; want %d ids", in, got, err, want)
		}
	}
}
