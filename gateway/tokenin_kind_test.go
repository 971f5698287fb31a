package gateway_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/tokenize/fallback"
)

// fakeGenEngine is a token-in engine kind that exists only in this test,
// with request and answer shapes of its own, unlike vLLM's (SGLang's
// /generate style: input_ids in, output_ids and meta_info out): a second
// token-in kind is one implementation of engines.TokenIn, with no edit in
// the gateway. It serves whole (non-streamed) answers.
type fakeGenEngine struct{}

var fakeGenKind = openai.RegisterKind("fakegen")

func init() { engines.Register(fakeGenEngine{}) }

func (fakeGenEngine) Kind() openai.Kind { return fakeGenKind }

func (fakeGenEngine) Inject() engines.Inject {
	return engines.Inject{ReturnTokenIDs: true, OmitsIDs: true, NoStreamUsage: true}
}

func (fakeGenEngine) Probe(*engines.Docs) int { return engines.ProbeNo }

func (fakeGenEngine) TokenInPaths() engines.TokenInPaths {
	return engines.TokenInPaths{Render: "/fake/render", Derender: "/fake/derender", Generate: "/generate", Abort: "/abort_request"}
}

func (fakeGenEngine) AbortBody(id string) []byte { return []byte(`{"rid":"` + id + `"}`) }

func (fakeGenEngine) EngineRequestID(id string) string { return id }

// RenderAnswer: render answers {"input_ids", "sampling_params"}.
func (fakeGenEngine) RenderAnswer(answer, _ []byte) ([]byte, []uint32, error) {
	ids, err := fallback.IDList(gjson.GetBytes(answer, "input_ids"), "input_ids")
	if err != nil {
		return nil, nil, err
	}
	return answer, ids, nil
}

func (fakeGenEngine) GenerateBody(genReq []byte, prompt []uint32, o engines.GenerateOptions) ([]byte, error) {
	body, err := sjson.SetBytes(genReq, "input_ids", prompt)
	if err == nil && o.RequestID != "" {
		body, err = sjson.SetBytes(body, "rid", o.RequestID)
	}
	return body, err
}

func (fakeGenEngine) ResumeBody(genBody []byte, prompt, ids []uint32, requestID string) ([]byte, int, error) {
	body, err := sjson.SetBytes(genBody, "input_ids", append(slices.Clone(prompt), ids...))
	if err == nil {
		body, err = sjson.SetBytes(body, "rid", requestID)
	}
	return body, -1, err
}

// ParseGenerate: {"output_ids", "meta_info": {"id", "finish_reason":
// {"type", "matched"}}}, one choice.
func (fakeGenEngine) ParseGenerate(answer []byte) (engines.Generated, error) {
	ids, err := fallback.IDList(gjson.GetBytes(answer, "output_ids"), "output_ids")
	if err != nil {
		return engines.Generated{}, err
	}
	fin := gjson.GetBytes(answer, "meta_info.finish_reason")
	return engines.Generated{
		RequestID: gjson.GetBytes(answer, "meta_info.id").String(),
		Choices: []engines.GenChoice{{
			IDs: ids, Finish: fin.Get("type").String(), StopReason: fin.Get("matched"),
			EndedOnTurn: fin.Get("type").String() == "stop" && fin.Get("matched").Type == gjson.Number,
		}},
	}, nil
}

var errFakeNoStream = errors.New("fakegen: no streaming")

func (fakeGenEngine) ParseGenerateChunk([]byte) (engines.GenChunk, error) {
	return engines.GenChunk{}, errFakeNoStream
}

func (fakeGenEngine) JoinGenerate([]byte, []uint32, []byte, []byte, string) ([]byte, error) {
	return nil, errFakeNoStream
}

func (fakeGenEngine) LengthChunk() []byte { return nil }

// DerenderBody sends the output ids without the matched end-of-turn id.
func (e fakeGenEngine) DerenderBody(answer []byte, _ []uint32, _ []byte) ([]byte, error) {
	g, err := e.ParseGenerate(answer)
	if err != nil {
		return nil, err
	}
	ids := g.Choices[0].IDs
	if g.Choices[0].EndedOnTurn {
		ids = ids[:len(ids)-1]
	}
	return json.Marshal(map[string]any{"output_ids": ids})
}

// DerenderAnswer: derender answers {"text"}; the chat completion gets the
// ids as the kind's Inject says (prompt_token_ids, choices[].token_ids).
func (e fakeGenEngine) DerenderAnswer(der, answer []byte, prompt []uint32, _ []byte) ([]byte, error) {
	g, err := e.ParseGenerate(answer)
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{
		"id": "chatcmpl-" + g.RequestID, "object": "chat.completion", "created": 1, "model": "fake-gen",
		"choices": []any{map[string]any{
			"index": 0, "message": map[string]any{"role": "assistant", "content": gjson.GetBytes(der, "text").String()},
			"finish_reason": g.Choices[0].Finish, "token_ids": g.Choices[0].IDs,
		}},
		"usage":            map[string]any{"prompt_tokens": len(prompt), "completion_tokens": len(g.Choices[0].IDs), "total_tokens": len(prompt) + len(g.Choices[0].IDs)},
		"prompt_token_ids": prompt,
	})
}

func (fakeGenEngine) DerenderStreamTail([]uint32, []byte) []byte { return nil }

func (fakeGenEngine) DerenderStreamBody([]byte, []byte, engines.GenChoice, bool, []byte, []byte) ([]byte, error) {
	return nil, errFakeNoStream
}

func (fakeGenEngine) DerenderStreamAnswer([]byte) (gjson.Result, gjson.Result, error) {
	return gjson.Result{}, gjson.Result{}, errFakeNoStream
}

var _ engines.TokenIn = fakeGenEngine{}

// fakeGenServer answers the fake kind's token-in endpoints and records
// the bodies it got, by path.
type fakeGenServer struct {
	mu     sync.Mutex
	bodies map[string][]string
}

func (f *fakeGenServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.bodies[r.URL.Path] = append(f.bodies[r.URL.Path], string(b))
	f.mu.Unlock()
	switch r.URL.Path {
	case "/v1/fake/render":
		io.WriteString(w, `{"input_ids":[101,102,103],"sampling_params":{"temperature":0,"max_new_tokens":8}}`)
	case "/generate":
		io.WriteString(w, `{"text":"ignored","output_ids":[7,8,2],"meta_info":{"id":"g1","finish_reason":{"type":"stop","matched":2}}}`)
	case "/v1/fake/derender":
		if got := gjson.GetBytes(b, "output_ids").Raw; got != "[7,8]" {
			http.Error(w, "derender got output_ids "+got, 400)
			return
		}
		io.WriteString(w, `{"text":"seven eight"}`)
	default:
		http.NotFound(w, r)
	}
}

// TestTokenInNewEngineKind: a token-in kind registered by a package of its
// own (here, this test) with its own request and answer shapes serves a
// chat call token-in through the gateway: render, generate with the
// rendered ids (and the gateway's request id), derender without the
// end-of-turn id; the client gets the derendered answer without the
// injected ids, the row has the engine's prompt and response ids and
// token_in "first".
func TestTokenInNewEngineKind(t *testing.T) {
	fake := &fakeGenServer{bodies: map[string][]string{}}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	s, _ := openSQLite(t)
	on := true
	e := newEnv(t, s, func(c *gateway.Config) {
		c.Backends = []gateway.Backend{{Model: "gen", TokenIn: &on, Replicas: []gateway.Replica{{Name: "fake-gen", URL: srv.URL + "/v1", Kind: "fakegen"}}}}
	})
	r := do(t, "POST", e.url+"/rollout/r1/attempt/a1/v1/chat/completions", `{"model":"gen","messages":[{"role":"user","content":"count"}]}`)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if c := gjson.GetBytes(r.body, "choices.0.message.content").String(); c != "seven eight" {
		t.Fatalf("the client got content %q, want the derendered %q: %s", c, "seven eight", r.body)
	}
	if strings.Contains(string(r.body), "token_ids") {
		t.Fatalf("the client's copy keeps the injected ids: %s", r.body)
	}
	fake.mu.Lock()
	gens := slices.Clone(fake.bodies["/generate"])
	fake.mu.Unlock()
	if len(gens) != 1 {
		t.Fatalf("the engine got %d generate requests, want 1: %q", len(gens), gens)
	}
	if ids := gjson.Get(gens[0], "input_ids").Raw; ids != "[101,102,103]" {
		t.Fatalf("generate got input_ids %s, want render's [101,102,103]: %s", ids, gens[0])
	}
	if rid := gjson.Get(gens[0], "rid").String(); !strings.HasPrefix(rid, "rollgate-") {
		t.Fatalf("generate got rid %q, want the gateway's request id (rollgate-...): %s", rid, gens[0])
	}
	row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
	if row.TokenIn != "first" || row.TokenSource != export.TokenSourceEngine ||
		!slices.Equal(row.PromptTokenIDs, []uint32{101, 102, 103}) || !slices.Equal(row.ResponseTokenIDs, []uint32{7, 8, 2}) {
		t.Fatalf("row: token_in %q source %q prompt %v response %v; want first, engine, [101 102 103], [7 8 2]",
			row.TokenIn, row.TokenSource, row.PromptTokenIDs, row.ResponseTokenIDs)
	}
}
