package clickhouse

import (
	"context"
	"net"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/storetest"
)

// TestNativeFallsBackToText points the native reader at a server that
// answers its hello with garbage (as a server speaking the protocol
// differently would): the read succeeds as text through clickhouse-go, with
// the same rows, and later reads stay on text. A server exception or a
// cancelled read never switches.
func TestNativeFallsBackToText(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, Options{})
	want := []export.Call{storetest.FullCall("ro-fb", "a1", 1, 0), storetest.FullCall("ro-fb", "a1", 2, 0)}
	want[1].SpanID = "s2"
	if err := s.Write(ctx, &export.Batch{Calls: want}); err != nil {
		t.Fatal(err)
	}
	// A server exception: the query's fault, not the protocol's.
	if err := s.readCalls(ctx, "FROM llm_calls WHERE no_such_column = 1", export.ReadOptions{}, nil, func(*export.Call) {}); err == nil || s.TextReads() {
		t.Fatalf("bad column: err %v, TextReads %v; want an error and the native reader kept", err, s.TextReads())
	}
	// A cancelled read.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Calls(cctx, export.CallFilter{RolloutID: "ro-fb"}); err == nil || s.TextReads() {
		t.Fatalf("cancelled: err %v, TextReads %v; want an error and the native reader kept", err, s.TextReads())
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("HTTP/1.0 400 Bad Request\r\n\r\nnot the native protocol"))
			c.Close()
		}
	}()
	opts := *s.native.opts
	opts.Addr = []string{ln.Addr().String()}
	s.native.close()
	s.native = newNativeReader(&opts, s.db)

	for round := range 2 {
		got, err := s.Calls(ctx, export.CallFilter{RolloutID: "ro-fb"})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if !s.TextReads() {
			t.Fatalf("round %d: the store did not switch to text reads", round)
		}
		if len(got) != 2 || got[0].SpanID != want[0].SpanID || got[1].SpanID != "s2" ||
			len(got[1].PromptTokenIDs) != len(want[1].PromptTokenIDs) || got[1].ResponseLogprobs[0] != want[1].ResponseLogprobs[0] {
			t.Fatalf("round %d: text reads gave %+v", round, got)
		}
	}
}
