package gateway_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/internal/openai"
)

// fakeEngine is an engine kind that exists only in this test: adding a
// kind is one package registering itself, with no edit anywhere else.
type fakeEngine struct{}

var fakeKind = openai.RegisterKind("fakellm")

func init() { engines.Register(fakeEngine{}) }

func (fakeEngine) Kind() openai.Kind { return fakeKind }

func (fakeEngine) Inject() engines.Inject {
	return engines.Inject{ReturnTokenIDs: true, OmitsIDs: true, NoStreamUsage: true}
}

func (fakeEngine) Probe(d *engines.Docs) int {
	if engines.OwnedBy(d) == "fakellm" {
		return engines.ProbeNamed
	}
	return engines.ProbeNo
}

func (fakeEngine) PauseModes() []string { return []string{"freeze"} }

func (fakeEngine) PauseRequest(mode string) (string, []byte) { return "/fake/pause?how=" + mode, nil }

func (fakeEngine) ResumeRequest() (string, []byte) { return "/fake/thaw", nil }

// fakeServer answers like the fake kind: /v1/models names it, chat
// completions return ids only when asked for, and the keys of ids not
// asked for are left out (OmitsIDs).
type fakeServer struct {
	mu    sync.Mutex
	seen  []string // method path?query of every request
	chats []map[string]any
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.seen = append(f.seen, r.Method+" "+r.URL.RequestURI())
	f.mu.Unlock()
	switch r.URL.Path {
	case "/v1/models":
		io.WriteString(w, `{"object":"list","data":[{"id":"fake-model","object":"model","owned_by":"fakellm"}]}`)
	case "/v1/chat/completions":
		var req map[string]any
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		f.mu.Lock()
		f.chats = append(f.chats, req)
		f.mu.Unlock()
		ids := ""
		if req["return_token_ids"] == true {
			ids = `,"prompt_token_ids":[7,8,9]`
		}
		cids := ""
		if req["return_token_ids"] == true {
			cids = `,"token_ids":[11,12]`
		}
		io.WriteString(w, `{"id":"c1","object":"chat.completion","created":1,"model":"fake-model","choices":[{"index":0,"message":{"role":"assistant","content":"hi!"},"finish_reason":"stop"`+cids+`}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}`+ids+`}`)
	case "/fake/pause", "/fake/thaw":
		io.WriteString(w, `{}`)
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeServer) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.seen)
}

// TestNewEngineKindThroughGateway: a kind registered by a package of its
// own (here, this test) is accepted in the configuration, recognised by
// the probe of a replica of kind "auto", gets what its Inject says injected
// (and stripped again from the client's copy), has its calls captured with
// the engine's ids, and its pause route called by POST /api/v1/pause.
func TestNewEngineKindThroughGateway(t *testing.T) {
	fake := &fakeServer{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) {
		c.Backends = []gateway.Backend{
			{Model: "named", Replicas: []gateway.Replica{{Name: "fake-named", URL: srv.URL + "/v1", Kind: "fakellm"}}},
			{Model: "probed", Replicas: []gateway.Replica{{Name: "fake-probed", URL: srv.URL + "/v1", Kind: "auto"}}},
		}
	})
	// The probe of the "auto" replica names the new kind.
	waitFor(t, "the auto replica resolved to kind fakellm", func() bool {
		r := do(t, "GET", e.url+"/api/v1/backends", "")
		return r.status == 200 && strings.Contains(string(r.body), `"resolved_kind":"fakellm"`) &&
			strings.Count(string(r.body), `"resolved_kind":"fakellm"`) == 2
	})
	for i, model := range []string{"named", "probed"} {
		r := do(t, "POST", e.url+"/rollout/r1/attempt/a1/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"hello"}]}`)
		if r.status != 200 {
			t.Fatalf("%s: status %d: %s", model, r.status, r.body)
		}
		// Injected for the engine, stripped (keys deleted) for the client.
		fake.mu.Lock()
		got := fake.chats[i]["return_token_ids"]
		fake.mu.Unlock()
		if got != true {
			t.Fatalf("%s: the engine got return_token_ids %v, want true (the kind's Inject)", model, got)
		}
		if strings.Contains(string(r.body), "token_ids") {
			t.Fatalf("%s: the client's copy keeps the injected ids: %s", model, r.body)
		}
		row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
		if row.TokenSource != export.TokenSourceEngine || !slices.Equal(row.PromptTokenIDs, []uint32{7, 8, 9}) || !slices.Equal(row.ResponseTokenIDs, []uint32{11, 12}) {
			t.Fatalf("%s: row source %q prompt %v response %v", model, row.TokenSource, row.PromptTokenIDs, row.ResponseTokenIDs)
		}
	}
	// The kind's own pause modes: accepted, called once per engine, undone.
	r := do(t, "POST", e.url+"/api/v1/pause?engine=freeze", "")
	if r.status != 200 {
		t.Fatalf("pause: %d %s", r.status, r.body)
	}
	do(t, "POST", e.url+"/api/v1/resume", "")
	reqs := strings.Join(fake.requests(), "\n")
	if !strings.Contains(reqs, "POST /fake/pause?how=freeze") || !strings.Contains(reqs, "POST /fake/thaw") {
		t.Fatalf("the engine's pause and resume routes were not called; it saw:\n%s", reqs)
	}
}
