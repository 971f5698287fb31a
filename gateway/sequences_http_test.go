package gateway_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/gateway/seqstore"
)

// TestSequenceStoreDownAnswers503: when no sequence id can be reserved
// (the store's database is gone), a call is answered 503 OpenAI-style,
// counted as rejected for "sequence_store", without a sequence id and not
// captured (the request may have reached the engine, whose answer is then
// dropped: the reservation runs beside it, see Server.admitAhead); calls of
// an attempt whose block is in memory still pass.
func TestSequenceStoreDownAnswers503(t *testing.T) {
	store, err := sqlite.Open(filepath.Join(t.TempDir(), "rollgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	seq, err := seqstore.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "seq.db"), seqstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, store, func(c *gateway.Config) { c.SequenceStore = seq })
	held := do(t, "POST", e.url+"/rollout/ro-1/attempt/at-1/v1/chat/completions", chatBody)
	if held.status != 200 || held.header.Get("x-sequence-id") != "1" {
		t.Fatalf("first call: %d %v %s", held.status, held.header, held.body)
	}
	seq.Close() // the database is gone
	r := do(t, "POST", e.url+"/rollout/ro-1/attempt/at-2/v1/chat/completions", chatBody)
	if r.status != 503 || r.header.Get("x-sequence-id") != "" || !strings.Contains(string(r.body), `"type":"server_error"`) ||
		!strings.Contains(string(r.body), "sequence id") {
		t.Fatalf("call without a sequence id: %d %v %s", r.status, r.header, r.body)
	}
	if n := e.rejected("sequence_store"); n != 1 {
		t.Fatalf("rejected{sequence_store} = %v, want 1", n)
	}
	if r := do(t, "POST", e.url+"/rollout/ro-1/attempt/at-1/v1/chat/completions", chatBody); r.status != 200 || r.header.Get("x-sequence-id") != "2" {
		t.Fatalf("call of a held attempt: %d %v", r.status, r.header)
	}
	if rows := e.storedCalls(export.CallFilter{RolloutID: "ro-1"}); len(rows) != 2 {
		t.Fatalf("%d rows stored, want the 2 answered calls", len(rows))
	}
}
