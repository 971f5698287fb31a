// Package storetest is the conformance suite every export.Store passes: what
// is written is read back field for field, the latest rollout row wins,
// ad-hoc queries render values the same way, and concurrent writers lose
// nothing. Each store package calls Run from its tests.
package storetest

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/rollgate/rollgate/export"
)

// Run runs the suite. open must return a new, empty store for each call
// (its own database or file); Run closes it.
func Run(t *testing.T, open func(t *testing.T) export.Store) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, s export.Store)
	}{
		{"RoundTrip", testRoundTrip},
		{"CallFilter", testCallFilter},
		{"CallByKey", testCallByKey},
		{"RolloutLatestWins", testRolloutLatestWins},
		{"RolloutUnknown", testRolloutUnknown},
		{"Query", testQuery},
		{"QueryError", testQueryError},
		{"EmptyBatch", testEmptyBatch},
		{"ConcurrentWrites", testConcurrentWrites},
		{"TrainingSteps", testTrainingSteps},
		{"TrainingRolloutRewards", testTrainingRolloutRewards},
		{"ReadsPage", testReadsPage},
		{"ReadsRollout", testReadsRollout},
		{"ReadsBridge", testReadsBridge},
		{"ReadsCalls", testReadsCalls},
		{"ReadsHostileValues", testReadsHostileValues},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			defer func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
			if s.Name() == "" {
				t.Fatal("Name() is empty")
			}
			tc.fn(t, s)
		})
	}
}

// FullCall returns a call with every column set to a distinctive value,
// including non-ASCII text, quotes, backslashes, newlines, large token arrays
// and a -Inf logprob. i makes span id, sequence id and times unique.
func FullCall(rollout, attempt string, seq uint64, choice uint32) export.Call {
	prompt := make([]uint32, 5000)
	for i := range prompt {
		prompt[i] = uint32(i*7919) % 151936
	}
	prompt[len(prompt)-1] = math.MaxUint32
	resp := []uint32{9707, 0, 11, 1}
	logprobs := []float32{-0.001, -1.5e-7, float32(math.Inf(-1)), -23.75}
	return export.Call{
		SpanID:             fmt.Sprintf("span-%s-%s-%d", rollout, attempt, seq),
		TraceID:            "4bf92f3577b34da6a3ce929d0e0e4736",
		RolloutID:          rollout,
		AttemptID:          attempt,
		TaskID:             "task-日本語",
		AgentName:          `agent "quoted" 'single'`,
		SequenceID:         seq,
		ChoiceIndex:        choice,
		StartTimeUnixNano:  1_700_000_000_123_456_789 + seq*1000,
		EndTimeUnixNano:    1_700_000_001_987_654_321 + seq*1000,
		TTFTNano:           123_456_789,
		Endpoint:           "/v1/chat/completions",
		Model:              "Qwen/Qwen3-0.6B",
		Backend:            "http://127.0.0.1:8000",
		PolicyVersion:      "v42",
		Stream:             true,
		HTTPStatus:         200,
		Error:              "",
		RequestBody:        `{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"héllo \"wörld\" \\ back\nslash 🚀"}]}`,
		ResponseBody:       `{"id":"chatcmpl-1","choices":[{"index":0,"message":{"role":"assistant","content":"Ça va? 你好"}}]}`,
		ResponseMessage:    `{"role":"assistant","content":"Ça va? 你好","tool_calls":[{"id":"c'1"}]}`,
		PromptTokenIDs:     prompt,
		ResponseTokenIDs:   resp,
		ResponseLogprobs:   logprobs,
		TokenSource:        export.TokenSourceEngine,
		TokenCheck:         "prompt_count,completion_count",
		TurnKind:           "retokenized",
		TurnPrefixLen:      7,
		TurnPrevSequenceID: 41,
		APIKeyName:         "team-a",
		BackendAttempts:    3,
		PolicyVersions:     `[[0,"v0"],[2,"v1"]]`,
		FinishReason:       "stop",
		PromptTokens:       uint32(len(prompt)),
		CompletionTokens:   uint32(len(resp)),
	}
}

// EmptyCall returns a call with only its key set: empty strings, zero
// numbers, no token arrays.
func EmptyCall(rollout, attempt string, seq uint64) export.Call {
	return export.Call{
		SpanID:      fmt.Sprintf("span-%s-%s-%d", rollout, attempt, seq),
		RolloutID:   rollout,
		AttemptID:   attempt,
		SequenceID:  seq,
		TokenSource: export.TokenSourceNone,
	}
}

// EqualCalls reports the first difference between two call lists, or "".
// Nil and empty token arrays are equal; logprobs compare bit for bit except
// that any NaN equals any NaN.
func EqualCalls(got, want []export.Call) string {
	if len(got) != len(want) {
		return fmt.Sprintf("got %d calls, want %d", len(got), len(want))
	}
	for i := range want {
		if d := diffCall(got[i], want[i]); d != "" {
			return fmt.Sprintf("call %d (span %q): %s", i, want[i].SpanID, d)
		}
	}
	return ""
}

func diffCall(got, want export.Call) string {
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	t := gv.Type()
	for i := 0; i < t.NumField(); i++ {
		name := t.Field(i).Name
		g, w := gv.Field(i), wv.Field(i)
		switch x := w.Interface().(type) {
		case []uint32:
			y := g.Interface().([]uint32)
			if len(x) != len(y) {
				return fmt.Sprintf("%s: got %d ids, want %d", name, len(y), len(x))
			}
			for j := range x {
				if x[j] != y[j] {
					return fmt.Sprintf("%s[%d]: got %d, want %d", name, j, y[j], x[j])
				}
			}
		case []float32:
			y := g.Interface().([]float32)
			if len(x) != len(y) {
				return fmt.Sprintf("%s: got %d values, want %d", name, len(y), len(x))
			}
			for j := range x {
				if math.Float32bits(x[j]) != math.Float32bits(y[j]) && !(x[j] != x[j] && y[j] != y[j]) {
					return fmt.Sprintf("%s[%d]: got %v, want %v", name, j, y[j], x[j])
				}
			}
		default:
			if !reflect.DeepEqual(g.Interface(), w.Interface()) {
				return fmt.Sprintf("%s: got %#v, want %#v", name, g.Interface(), w.Interface())
			}
		}
	}
	return ""
}

func write(t *testing.T, s export.Store, b *export.Batch) {
	t.Helper()
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatalf("Write(%d rows): %v", b.Len(), err)
	}
}

func testRoundTrip(t *testing.T, s export.Store) {
	ctx := context.Background()
	big := FullCall("r1", "a1", 3, 0)
	big.PromptTokenIDs = make([]uint32, 200_000)
	for i := range big.PromptTokenIDs {
		big.PromptTokenIDs[i] = uint32(i)
	}
	big.ResponseLogprobs = make([]float32, 50_000)
	big.ResponseTokenIDs = make([]uint32, 50_000)
	for i := range big.ResponseLogprobs {
		big.ResponseLogprobs[i] = -float32(i) / 7
		big.ResponseTokenIDs[i] = uint32(i * 3)
	}
	// Values whose text forms are hard to read back bit for bit (readers
	// may move arrays as text): subnormals, extremes, -0, non-finite.
	copy(big.ResponseLogprobs, []float32{math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, math.Float32frombits(0x007fffff),
		math.MaxFloat32, -math.MaxFloat32, math.Float32frombits(1 << 31), float32(math.Inf(1)), float32(math.NaN()),
		-0.1234567, -1.0000001e-7, math.Float32frombits(0x3f800001), math.Nextafter32(-1, 0)})
	big.ResponseTokenIDs[1] = math.MaxUint32
	errCall := EmptyCall("r1", "a1", 4)
	errCall.HTTPStatus = 502
	errCall.Error = "backend: connection refused; 'quoted' \"double\" \\ \t tab"
	want := []export.Call{
		FullCall("r1", "a1", 1, 0),
		FullCall("r1", "a1", 1, 1),
		EmptyCall("r1", "a1", 2),
		big,
		errCall,
		EmptyCall("", "", 1), // unattributed call
	}
	// Write in a different order than the read order.
	batch := &export.Batch{Calls: []export.Call{want[3], want[5], want[1], want[0], want[4], want[2]}}
	write(t, s, batch)

	got, err := s.Calls(ctx, export.CallFilter{})
	if err != nil {
		t.Fatalf("Calls: %v", err)
	}
	// Expected order: rollout, attempt, sequence, choice ("" sorts first).
	wantOrder := []export.Call{want[5], want[0], want[1], want[2], want[3], want[4]}
	if d := EqualCalls(got, wantOrder); d != "" {
		t.Fatal(d)
	}
}

func testCallFilter(t *testing.T, s export.Store) {
	ctx := context.Background()
	var calls []export.Call
	for _, r := range []string{"ra", "rb"} {
		for _, a := range []string{"a1", "a2"} {
			for seq := uint64(1); seq <= 3; seq++ {
				calls = append(calls, EmptyCall(r, a, seq))
			}
		}
	}
	write(t, s, &export.Batch{Calls: calls})
	f := func(filter export.CallFilter, want []string) {
		t.Helper()
		got, err := s.Calls(ctx, filter)
		if err != nil {
			t.Fatalf("Calls(%+v): %v", filter, err)
		}
		var spans []string
		for _, c := range got {
			spans = append(spans, c.SpanID)
		}
		if strings.Join(spans, " ") != strings.Join(want, " ") {
			t.Fatalf("Calls(%+v) = %v, want %v", filter, spans, want)
		}
	}
	f(export.CallFilter{RolloutID: "rb", AttemptID: "a2"}, []string{"span-rb-a2-1", "span-rb-a2-2", "span-rb-a2-3"})
	f(export.CallFilter{RolloutID: "ra", Limit: 4}, []string{"span-ra-a1-1", "span-ra-a1-2", "span-ra-a1-3", "span-ra-a2-1"})
	f(export.CallFilter{AttemptID: "a1", Limit: 2}, []string{"span-ra-a1-1", "span-ra-a1-2"})
	f(export.CallFilter{SpanID: "span-rb-a1-2"}, []string{"span-rb-a1-2"})
	f(export.CallFilter{RolloutID: "nope"}, nil)
	f(export.CallFilter{RolloutID: "ra'; DROP TABLE llm_calls; --"}, nil)
	all, err := s.Calls(ctx, export.CallFilter{})
	if err != nil || len(all) != len(calls) {
		t.Fatalf("Calls() = %d rows, %v; want %d", len(all), err, len(calls))
	}
}

// testCallByKey reads single calls by (rollout, attempt, sequence id,
// choice), the latest started when the attempt is not named, and a page of
// an attempt's calls from a sequence id without their bodies.
func testCallByKey(t *testing.T, s export.Store) {
	ctx := context.Background()
	var calls []export.Call
	for _, a := range []string{"a1", "a2"} {
		for seq := uint64(1); seq <= 3; seq++ {
			for choice := uint32(0); choice < 2; choice++ {
				c := FullCall("rk", a, seq, choice)
				c.SpanID = fmt.Sprintf("span-rk-%s-%d-%d", a, seq, choice)
				c.StartTimeUnixNano = seq*1000 + uint64(choice)
				if a == "a2" {
					c.StartTimeUnixNano += 1_000_000
				}
				calls = append(calls, c)
			}
		}
	}
	calls = append(calls, FullCall("rk'x", "a1", 2, 0))
	write(t, s, &export.Batch{Calls: calls})
	f := func(k export.CallKey, want string) {
		t.Helper()
		got, err := s.Call(ctx, k)
		switch {
		case err != nil:
			t.Fatalf("Call(%+v): %v", k, err)
		case want == "" && got != nil:
			t.Fatalf("Call(%+v) = span %q, want none", k, got.SpanID)
		case want != "" && (got == nil || got.SpanID != want):
			t.Fatalf("Call(%+v) = %+v, want span %q", k, got, want)
		}
	}
	f(export.CallKey{RolloutID: "rk", AttemptID: "a1", SequenceID: 2, ChoiceIndex: 1}, "span-rk-a1-2-1")
	f(export.CallKey{RolloutID: "rk", SequenceID: 3}, "span-rk-a2-3-0") // a2 started later
	f(export.CallKey{RolloutID: "rk", AttemptID: "a1", SequenceID: 4}, "")
	f(export.CallKey{RolloutID: "rk", AttemptID: "a3", SequenceID: 1}, "")
	f(export.CallKey{RolloutID: "rk'x", SequenceID: 2}, calls[len(calls)-1].SpanID)
	got, err := s.Call(ctx, export.CallKey{RolloutID: "rk", AttemptID: "a1", SequenceID: 1})
	if err != nil || got == nil {
		t.Fatalf("Call: %v, %v", got, err)
	}
	want := calls[0]
	if d := diffCall(*got, want); d != "" {
		t.Errorf("Call read back differs: %s", d)
	}
	page, err := s.Calls(ctx, export.CallFilter{RolloutID: "rk", AttemptID: "a2", FromSequence: 2, Limit: 3,
		Omit: export.ReadOptions{NoRequestBody: true, NoResponseBody: true}})
	if err != nil {
		t.Fatal(err)
	}
	var spans []string
	for _, c := range page {
		spans = append(spans, c.SpanID)
		if c.RequestBody != "" || c.ResponseBody != "" || c.ResponseMessage == "" || len(c.PromptTokenIDs) == 0 {
			t.Errorf("%s: bodies not omitted or other columns lost (request %d bytes, response %d, message %d, %d prompt ids)",
				c.SpanID, len(c.RequestBody), len(c.ResponseBody), len(c.ResponseMessage), len(c.PromptTokenIDs))
		}
	}
	if w := "span-rk-a2-2-0 span-rk-a2-2-1 span-rk-a2-3-0"; strings.Join(spans, " ") != w {
		t.Errorf("page from sequence 2 = %v, want %s", spans, w)
	}
	d, err := s.ReadRollout(ctx, "rk", export.ReadOptions{NoCalls: true})
	if err != nil || len(d.Calls) != 0 {
		t.Errorf("ReadRollout(NoCalls): %v, %d calls, want none", err, len(d.Calls))
	}
}

func testRolloutLatestWins(t *testing.T, s export.Store) {
	ctx := context.Background()
	mk := func(attempt, status string, updated uint64) export.Rollout {
		return export.Rollout{
			RolloutID: "ro-1", AttemptID: attempt, TaskID: "task-1", Status: status,
			// The group differs per row, so a store that keeps an older
			// row's group_id (or drops the column) fails.
			GroupID:         "grp-" + status + " ü'\"",
			Metadata:        fmt.Sprintf(`{"status":%q,"note":"naïve 'x'"}`, status),
			CreatedUnixNano: 1_700_000_000_000_000_000, UpdatedUnixNano: updated,
		}
	}
	// Rows for one attempt arrive in several batches and out of order.
	write(t, s, &export.Batch{Rollouts: []export.Rollout{mk("a1", "running", 2_000), mk("a2", "running", 2_000)}})
	write(t, s, &export.Batch{Rollouts: []export.Rollout{mk("a1", "succeeded", 5_000), mk("a1", "queued", 1_000)}})
	write(t, s, &export.Batch{Rollouts: []export.Rollout{mk("a2", "failed", 3_000)}})
	write(t, s, &export.Batch{Rollouts: []export.Rollout{mk("a1", "stale", 4_000)}})
	// Another rollout must not leak in.
	other := mk("a1", "succeeded", 9_000)
	other.RolloutID = "ro-2"
	write(t, s, &export.Batch{Rollouts: []export.Rollout{other}})

	calls := []export.Call{FullCall("ro-1", "a1", 1, 0), EmptyCall("ro-1", "a2", 1), EmptyCall("ro-2", "a1", 1)}
	rewards := []export.Reward{
		{RolloutID: "ro-1", AttemptID: "a1", SequenceID: 0, Name: "primary", Value: 1, Source: "api", TimeUnixNano: 10},
		{RolloutID: "ro-1", AttemptID: "a1", SequenceID: 1, Name: "format", Value: -0.25, Source: "air:format", TimeUnixNano: 9},
		{RolloutID: "ro-2", AttemptID: "a1", SequenceID: 0, Name: "primary", Value: 0.5, Source: "api", TimeUnixNano: 11},
	}
	write(t, s, &export.Batch{Calls: calls, Rewards: rewards})

	d, err := s.Rollout(ctx, "ro-1")
	if err != nil {
		t.Fatalf("Rollout: %v", err)
	}
	wantAttempts := []export.Rollout{mk("a1", "succeeded", 5_000), mk("a2", "failed", 3_000)}
	if !reflect.DeepEqual(d.Attempts, wantAttempts) {
		t.Fatalf("attempts:\n got %+v\nwant %+v", d.Attempts, wantAttempts)
	}
	if diff := EqualCalls(d.Calls, calls[:2]); diff != "" {
		t.Fatalf("calls: %s", diff)
	}
	wantRewards := []export.Reward{rewards[0], rewards[1]}
	if !reflect.DeepEqual(d.Rewards, wantRewards) {
		t.Fatalf("rewards:\n got %+v\nwant %+v", d.Rewards, wantRewards)
	}
}

func testRolloutUnknown(t *testing.T, s export.Store) {
	d, err := s.Rollout(context.Background(), "does-not-exist")
	if err != nil {
		t.Fatalf("Rollout: %v", err)
	}
	if d == nil || len(d.Attempts)+len(d.Calls)+len(d.Rewards) != 0 {
		t.Fatalf("Rollout(unknown) = %+v, want empty", d)
	}
}

func testQuery(t *testing.T, s export.Store) {
	ctx := context.Background()
	c1 := EmptyCall("rq", "a1", 1)
	c1.PromptTokenIDs = []uint32{1, 2, 3}
	c1.ResponseLogprobs = []float32{-0.5, -1.25}
	c1.Model = "modèle 'x'"
	c1.PromptTokens = 3
	c2 := EmptyCall("rq", "a1", 2)
	c2.PromptTokens = 7
	write(t, s, &export.Batch{
		Calls:   []export.Call{c1, c2},
		Rewards: []export.Reward{{RolloutID: "rq", AttemptID: "a1", Name: "primary", Value: 0.75, Source: "api", TimeUnixNano: 1}},
	})
	f := func(query string, wantCols []string, wantRows [][]string) {
		t.Helper()
		res, err := s.Query(ctx, query)
		if err != nil {
			t.Fatalf("Query(%s): %v", query, err)
		}
		if !reflect.DeepEqual(res.Columns, wantCols) {
			t.Fatalf("Query(%s) columns = %q, want %q", query, res.Columns, wantCols)
		}
		if len(res.Rows) != len(wantRows) || (len(wantRows) > 0 && !reflect.DeepEqual(res.Rows, wantRows)) {
			t.Fatalf("Query(%s) rows = %q, want %q", query, res.Rows, wantRows)
		}
		if rs, ok := s.(export.RowStreamer); ok {
			var rows [][]string
			if err := rs.QueryEach(ctx, query, func(row []string) error { rows = append(rows, append([]string(nil), row...)); return nil }); err != nil {
				t.Fatalf("QueryEach(%s): %v", query, err)
			}
			if len(rows) != len(wantRows) || (len(wantRows) > 0 && !reflect.DeepEqual(rows, wantRows)) {
				t.Fatalf("QueryEach(%s) rows = %q, want %q", query, rows, wantRows)
			}
		}
	}
	f("SELECT sequence_id, model, prompt_token_ids, response_token_ids, response_logprobs, prompt_tokens FROM llm_calls WHERE rollout_id = 'rq' ORDER BY sequence_id",
		[]string{"sequence_id", "model", "prompt_token_ids", "response_token_ids", "response_logprobs", "prompt_tokens"},
		[][]string{
			{"1", "modèle 'x'", "[1,2,3]", "[]", "[-0.5,-1.25]", "3"},
			{"2", "", "[]", "[]", "[]", "7"},
		})
	f("SELECT count(*) AS n, sum(prompt_tokens) AS tokens FROM llm_calls WHERE rollout_id = 'rq'",
		[]string{"n", "tokens"}, [][]string{{"2", "10"}})
	f("SELECT name, value FROM rewards WHERE rollout_id = 'rq'",
		[]string{"name", "value"}, [][]string{{"primary", "0.75"}})
	f("SELECT span_id FROM llm_calls WHERE rollout_id = 'none'", []string{"span_id"}, nil)
	write(t, s, &export.Batch{Rollouts: []export.Rollout{{RolloutID: "rq", AttemptID: "a1", TaskID: "t", GroupID: "grp-q", Status: "succeeded", Metadata: "{}", UpdatedUnixNano: 1}}})
	f("SELECT task_id, group_id FROM rollouts WHERE rollout_id = 'rq'",
		[]string{"task_id", "group_id"}, [][]string{{"t", "grp-q"}})
}

func testQueryError(t *testing.T, s export.Store) {
	if _, err := s.Query(context.Background(), "SELECT no_such_column FROM llm_calls"); err == nil {
		t.Fatal("Query with an unknown column: no error")
	}
	if _, err := s.Query(context.Background(), "SELEC 1"); err == nil {
		t.Fatal("Query with a syntax error: no error")
	}
}

func testEmptyBatch(t *testing.T, s export.Store) {
	write(t, s, &export.Batch{})
	if err := s.Write(context.Background(), nil); err != nil {
		t.Fatalf("Write(nil): %v", err)
	}
	got, err := s.Calls(context.Background(), export.CallFilter{})
	if err != nil || len(got) != 0 {
		t.Fatalf("Calls after empty writes = %d rows, %v; want 0", len(got), err)
	}
}

func testConcurrentWrites(t *testing.T, s export.Store) {
	const writers, batches, perBatch = 4, 5, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers*batches)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for b := 0; b < batches; b++ {
				batch := &export.Batch{}
				for i := 0; i < perBatch; i++ {
					seq := uint64(b*perBatch + i + 1)
					batch.Calls = append(batch.Calls, FullCall(fmt.Sprintf("rc-%d", w), "a1", seq, 0))
					batch.Rewards = append(batch.Rewards, export.Reward{RolloutID: fmt.Sprintf("rc-%d", w), AttemptID: "a1", SequenceID: seq, Name: "step", Value: float64(seq), Source: "api", TimeUnixNano: seq})
				}
				batch.Rollouts = []export.Rollout{{RolloutID: fmt.Sprintf("rc-%d", w), AttemptID: "a1", Status: "running", UpdatedUnixNano: uint64(b + 1)}}
				if err := s.Write(context.Background(), batch); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent Write: %v", err)
	}
	res, err := s.Query(context.Background(), "SELECT count(*) AS n FROM llm_calls")
	if err != nil {
		t.Fatalf("Query: %v", err)
	}
	if want := fmt.Sprint(writers * batches * perBatch); len(res.Rows) != 1 || res.Rows[0][0] != want {
		t.Fatalf("llm_calls count = %v, want %s", res.Rows, want)
	}
	for w := 0; w < writers; w++ {
		d, err := s.Rollout(context.Background(), fmt.Sprintf("rc-%d", w))
		if err != nil {
			t.Fatalf("Rollout: %v", err)
		}
		if len(d.Calls) != batches*perBatch || len(d.Rewards) != batches*perBatch || len(d.Attempts) != 1 || d.Attempts[0].UpdatedUnixNano != batches {
			t.Fatalf("rollout rc-%d: %d calls, %d rewards, attempts %+v", w, len(d.Calls), len(d.Rewards), d.Attempts)
		}
		for i, c := range d.Calls {
			if c.SequenceID != uint64(i+1) {
				t.Fatalf("rollout rc-%d: call %d has sequence %d", w, i, c.SequenceID)
			}
		}
	}
}

// OldRollout is the row an upgrade test stores with a store's schema from
// before the rollouts table had group_id (the group was only in metadata);
// CheckUpgradedRollouts reads it back after the upgrade.
func OldRollout() export.Rollout {
	return export.Rollout{RolloutID: "ro-old", AttemptID: "a1", TaskID: "task-old", Status: "succeeded",
		Metadata: `{"group_id":"grp-old"}`, CreatedUnixNano: 1_700_000_000_000_000_000, UpdatedUnixNano: 1_700_000_100_000_000_000}
}

// CheckUpgradedRollouts checks a store opened on a database whose rollouts
// table was created without group_id and holds OldRollout: the old row reads
// back whole with GroupID "" (its group stays in metadata), new rows and a
// later status row of the old rollout store their group, and ad-hoc queries
// see the column.
func CheckUpgradedRollouts(t *testing.T, s export.Store) {
	t.Helper()
	ctx := context.Background()
	old := OldRollout()
	d, err := s.Rollout(ctx, old.RolloutID)
	if err != nil {
		t.Fatalf("Rollout after upgrade: %v", err)
	}
	if want := []export.Rollout{old}; !reflect.DeepEqual(d.Attempts, want) {
		t.Fatalf("old rollout after upgrade:\n got %+v\nwant %+v", d.Attempts, want)
	}
	fresh := export.Rollout{RolloutID: "ro-new", AttemptID: "a1", TaskID: "task-new", GroupID: "grp-new", Status: "running",
		Metadata: `{"group_id":"grp-new"}`, CreatedUnixNano: 1_700_000_200_000_000_000, UpdatedUnixNano: 1_700_000_200_000_000_000}
	later := old
	later.GroupID, later.Status, later.UpdatedUnixNano = "grp-old", "failed", old.UpdatedUnixNano+1
	write(t, s, &export.Batch{Rollouts: []export.Rollout{fresh, later}})
	for _, want := range []export.Rollout{fresh, later} {
		d, err := s.Rollout(ctx, want.RolloutID)
		if err != nil {
			t.Fatalf("Rollout(%s): %v", want.RolloutID, err)
		}
		if !reflect.DeepEqual(d.Attempts, []export.Rollout{want}) {
			t.Fatalf("rollout %s after upgrade:\n got %+v\nwant %+v", want.RolloutID, d.Attempts, []export.Rollout{want})
		}
	}
	res, err := s.Query(ctx, "SELECT rollout_id, group_id FROM rollouts WHERE rollout_id = 'ro-new'")
	if err != nil || len(res.Rows) != 1 || !reflect.DeepEqual(res.Rows[0], []string{"ro-new", "grp-new"}) {
		t.Fatalf("SELECT group_id after upgrade: %+v, %v", res, err)
	}
}
