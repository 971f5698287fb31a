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
	var rows []capRow
	for {
		var err error
		rows, err = fetchRows(ctx, store, prefix)
		if err != nil {
			return nil, err
		}
		found := 0
		for i := range rows {
			if want[rows[i].span] != nil {
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
		call := want[row.span]
		if call == nil {
			c.Extra++
			continue
		}
		count[row.span]++
		if count[row.span] == 2 {
			c.Duplicate++
			example("request %s stored more than once", row.span)
		}
		if row.source != export.TokenSourceEngine || row.ids != row.completion {
			c.BadTokens++
			example("request %s: token_source %q, %d response ids for completion_tokens %d (check %q)",
				row.span, row.source, row.ids, row.completion, row.check)
		}
		switch {
		case row.rollout != call.RolloutID || row.attempt != call.AttemptID:
			c.Mismatch++
			example("request %s: stored for %s/%s, sent for %s/%s", row.span, row.rollout, row.attempt, call.RolloutID, call.AttemptID)
		case call.SequenceID != "" && row.seq != call.SequenceID:
			c.Mismatch++
			example("request %s: stored sequence id %s, client saw %s", row.span, row.seq, call.SequenceID)
		case call.CompletionTokens >= 0 && row.completion != call.CompletionTokens:
			c.Mismatch++
			example("request %s: stored completion_tokens %d, client saw %d", row.span, row.completion, call.CompletionTokens)
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

// capRow is what Verify reads of one llm_calls row.
type capRow struct {
	span, rollout, attempt, seq, source, check string
	completion, ids                            int
}

// verifyColumns are the llm_calls columns Verify reads, in capRow's order.
const verifyColumns = "span_id, rollout_id, attempt_id, sequence_id, token_source, token_check, completion_tokens, response_token_ids"

// fetchRows reads the rows of rollouts whose id starts with prefix. It uses
// SQL that SQLite and ClickHouse both accept (a range on rollout_id rather
// than LIKE, whose '_' is a wildcard) and reads only the columns it checks.
func fetchRows(ctx context.Context, store export.Store, prefix string) ([]capRow, error) {
	// prefix ends in '-'; '.' is the next byte, so the range is exactly the prefix.
	q := "SELECT " + verifyColumns + " FROM llm_calls WHERE rollout_id >= '" + prefix +
		"' AND rollout_id < '" + strings.TrimSuffix(prefix, "-") + ".'"
	res, err := store.Query(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("load: reading captured calls: %w", err)
	}
	if len(res.Columns) != 8 {
		return nil, fmt.Errorf("load: reading captured calls: %d columns, want 8", len(res.Columns))
	}
	rows := make([]capRow, 0, len(res.Rows))
	for _, v := range res.Rows {
		if len(v) != 8 {
			return nil, fmt.Errorf("load: reading captured calls: row of %d values, want 8", len(v))
		}
		completion, err := strconv.Atoi(v[6])
		if err != nil {
			return nil, fmt.Errorf("load: completion_tokens %q: %w", v[6], err)
		}
		rows = append(rows, capRow{span: v[0], rollout: v[1], attempt: v[2], seq: v[3], source: v[4], check: v[5],
			completion: completion, ids: countArray(v[7])})
	}
	return rows, nil
}

// countArray counts the elements of an array of numbers rendered as text,
// "[1,2,3]" (both stores render arrays that way); -1 when it is not one.
func countArray(s string) int {
	s = strings.TrimSpace(s)
	if len(s) < 2 || s[0] != '[' || s[len(s)-1] != ']' {
		return -1
	}
	if strings.TrimSpace(s[1:len(s)-1]) == "" {
		return 0
	}
	return strings.Count(s, ",") + 1
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
