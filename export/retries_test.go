package export

import (
	"slices"
	"testing"
)

func TestSupersededTries(t *testing.T) {
	type try struct {
		seq    uint64
		retry  uint16
		status uint16
		err    string
	}
	f := func(name string, in []try, want []bool) {
		t.Helper()
		calls := make([]Call, len(in))
		for i, c := range in {
			calls[i] = Call{RolloutID: "r", AttemptID: "a", SequenceID: c.seq, RetryCount: c.retry, HTTPStatus: c.status, Error: c.err}
		}
		if got := SupersededTries(calls); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	gone := "client disconnected before the response"
	f("no retries", []try{{1, 0, 200, ""}, {2, 0, 500, "x"}}, nil)
	f("retry answered", []try{{1, 0, 499, gone}, {1, 1, 200, ""}, {2, 0, 200, ""}}, []bool{true, false, false})
	f("stream cut, then answered", []try{{1, 0, 200, "client disconnected mid-stream"}, {1, 1, 200, ""}}, []bool{true, false})
	f("no try answered: all kept", []try{{1, 0, 503, "a"}, {1, 1, 503, "b"}}, nil)
	f("the last answered try wins", []try{{1, 0, 200, ""}, {1, 1, 200, ""}, {1, 2, 503, "c"}}, []bool{true, false, true})
	f("two choices of the answered try", []try{{3, 0, 499, gone}, {3, 1, 200, ""}, {3, 1, 200, ""}}, []bool{true, false, false})
	// Equal sequence ids of two attempts are not tries of one call.
	calls := []Call{{RolloutID: "r", AttemptID: "a", SequenceID: 1, HTTPStatus: 503, Error: "x"},
		{RolloutID: "r", AttemptID: "b", SequenceID: 1, RetryCount: 1, HTTPStatus: 200}}
	if got := SupersededTries(calls); got != nil {
		t.Errorf("two attempts: %v, want nil", got)
	}
}
