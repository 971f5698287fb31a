package load

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/rollgate/rollgate/export"
)

// Capture is the outcome of checking a run's calls against the store.
type Capture struct {
	// Expected is the number of successful calls the client saw with an
	// x-request-id (each must be stored as exactly one row: n = 1).
	Expected int `json:"expected"`
	// Found is how many of them have at least one row.
	Found int `json:"found"`
	// Missing is Expected - Found.
	Missing int `json:"missing"`
	// Duplicate counts request ids stored more than once.
	Duplicate int `json:"duplicate"`
	// BadTokens counts rows whose token_source is not "engine" or whose
	// response_token_ids length differs from completion_tokens.
	BadTokens int `json:"bad_tokens"`
	// Mismatch counts rows that disagree with what the client saw: rollout,
	// attempt, sequence id, or completion_tokens when the client saw usage.
	Mismatch int `json:"mismatch"`
	// NoRequestID counts successful calls whose answer had no x-request-id
	// (they cannot be checked and are not in Expected).
	NoRequestID int `json:"no_request_id"`
	// Extra counts rows of this run's rollouts that match no successful call
	// (for example calls that failed on the client's side).
	Extra int `json:"extra"`
	// WaitedSec is how long Verify waited for the capture to catch up.
	WaitedSec float64 `json:"waited_s"`
	// Examples describe up to five problems.
	Examples []string `json:"examples,omitempty"`
}

// OK reports whether every expected call is stored once with engine token ids
// that agree with the client.
func (c *Capture) OK() bool {
	return c.Missing == 0 && c.Duplicate == 0 && c.BadTokens == 0 && c.Mismatch == 0 && c.NoRequestID == 0
}

// Verify checks r's calls against store: every successful call the client saw
// (by its x-request-id, which rollgate sets to the row's span_id) must be
// present exactly once, with token_source "engine", len(response_token_ids) ==
// completion_tokens, and the rollout, attempt, sequence id and (when the
// client saw usage) completion_tokens the client saw. Capture is
// asynchronous, so Verify polls the store until every call is there or wait
// has passed, then reports what is still missing.
func Verify(ctx context.Context, store export.Store, r *Result, wait time.Duration) (*Capture, error) {
	want := map[string]*Call{}
	c := &Capture{}
	for i := range r.Calls {
		call := &r.Calls[i]
		if !call.OK() {
			continue
		}
		if call.RequestID == "" {
			c.NoRequestID++
			continue
		}
		want[call.RequestID] = call
	}
	c.Expected = len(want)
	if !validRunID(r.Config.RunID) {
		return nil, fmt.Errorf("load: run id %q: want letters, digits and '-' only", r.Config.RunID)
	}
	prefix := r.Config.RunID + "-"
	start := time.Now()
	var rows []export.CallCheck
	for {
		var err error
		rows, err = fetchRows(ctx, store, prefix)
		if err != nil {
			return nil, err
		}
		found := 0
		for i := range rows {
			if want[rows[i].SpanID] != nil {
				found++
			}
		}
		if found >= len(want) || time.Since(start) >= wait {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("load: waiting for the capture: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	c.WaitedSec = time.Since(start).Seconds()
	example := func(format string, args ...any) {
		if len(c.Examples) < 5 {
			c.Examples = append(c.Examples, fmt.Sprintf(format, args...))
		}
	}
	count := map[string]int{}
	for i := range rows {
		row := &rows[i]
		call := want[row.SpanID]
		if call == nil {
			c.Extra++
			continue
		}
		count[row.SpanID]++
		if count[row.SpanID] == 2 {
			c.Duplicate++
			example("request %s stored more than once", row.SpanID)
		}
		if row.TokenSource != export.TokenSourceEngine || row.ResponseTokens != int(row.CompletionTokens) {
			c.BadTokens++
			example("request %s: token_source %q, %d response ids for completion_tokens %d (check %q)",
				row.SpanID, row.TokenSource, row.ResponseTokens, row.CompletionTokens, row.TokenCheck)
		}
		switch {
		case row.RolloutID != call.RolloutID || row.AttemptID != call.AttemptID:
			c.Mismatch++
			example("request %s: stored for %s/%s, sent for %s/%s", row.SpanID, row.RolloutID, row.AttemptID, call.RolloutID, call.AttemptID)
		case call.SequenceID != "" && strconv.FormatUint(row.SequenceID, 10) != call.SequenceID:
			c.Mismatch++
			example("request %s: stored sequence id %d, client saw %s", row.SpanID, row.SequenceID, call.SequenceID)
		case call.CompletionTokens >= 0 && int(row.CompletionTokens) != call.CompletionTokens:
			c.Mismatch++
			example("request %s: stored completion_tokens %d, client saw %d", row.SpanID, row.CompletionTokens, call.CompletionTokens)
		}
	}
	c.Found = len(count)
	c.Missing = c.Expected - c.Found
	for id := range want {
		if count[id] == 0 {
			example("request %s (rollout %s turn %d) not stored", id, want[id].RolloutID, want[id].Turn)
			break
		}
	}
	return c, nil
}

// fetchRows reads the rows of rollouts whose id starts with prefix
// (export.Reader.CallChecks: prefix ends in '-', and '.' is the next byte,
// so the range is exactly the prefix).
func fetchRows(ctx context.Context, store export.Store, prefix string) ([]export.CallCheck, error) {
	rows, err := store.CallChecks(ctx, export.RolloutRange{From: prefix, To: strings.TrimSuffix(prefix, "-") + "."})
	if err != nil {
		return nil, fmt.Errorf("load: reading captured calls: %w", err)
	}
	return rows, nil
}

// validRunID reports whether id is safe to put in SQL: letters, digits, '-'.
func validRunID(id string) bool {
	if id == "" {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
