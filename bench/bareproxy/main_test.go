package main

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/bench/load"
	"github.com/rollgate/rollgate/bench/mock"
)

// serve starts the proxy on a loopback port in front of upstream (host:port).
func serve(t *testing.T, upstream string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(upstream)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

// TestForwards runs the load generator's agents through the proxy over real
// loopback HTTP: streamed and not, with tool calls, every call answered whole.
func TestForwards(t *testing.T) {
	ms, base, err := mock.Start(mock.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Shutdown() })
	url := serve(t, strings.TrimSuffix(strings.TrimPrefix(base, "http://"), "/v1"))
	for _, stream := range []bool{false, true} {
		res, err := load.Run(context.Background(), load.Config{BaseURL: url, PathStyle: load.PathPlain,
			Agents: 2, Turns: 4, Rollouts: 4, ToolEvery: 3, Stream: stream, IncludeUsage: stream, ReturnTokenIDs: true})
		if err != nil {
			t.Fatal(err)
		}
		// turns 0 and 3 of each rollout ask for a tool; turn 1 sends its result.
		if rep := res.Summary(); rep.OK != 16 || rep.Errors != 0 || rep.ToolCalls != 8 {
			t.Fatalf("stream=%v: %+v", stream, rep)
		}
	}
}

// TestUpstreamDown answers 502 with a JSON error when the engine is not there.
func TestUpstreamDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	url := serve(t, dead)
	status, body, err := fasthttp.Post(nil, url+"/v1/chat/completions", nil)
	if err != nil {
		t.Fatal(err)
	}
	if status != fasthttp.StatusBadGateway || !gjson.ValidBytes(body) || gjson.GetBytes(body, "error.message").String() == "" {
		t.Fatalf("HTTP %d: %s", status, body)
	}
}
