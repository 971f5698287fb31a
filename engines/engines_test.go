package engines_test

import (
	"net/http"
	"testing"

	"github.com/rollgate/rollgate/engines"
	_ "github.com/rollgate/rollgate/engines/llamacpp"
	_ "github.com/rollgate/rollgate/engines/openai"
	_ "github.com/rollgate/rollgate/engines/sglang"
	_ "github.com/rollgate/rollgate/engines/vllm"
	"github.com/rollgate/rollgate/internal/openai"
)

// docs serves fixed documents and counts the fetches.
func docs(pages map[string]string, fetches map[string]int) *engines.Docs {
	return engines.NewDocs("/v1", func(path string) (int, []byte) {
		fetches[path]++
		if b, ok := pages[path]; ok {
			return http.StatusOK, []byte(b)
		}
		return http.StatusNotFound, nil
	})
}

// TestIdentify: the probe's verdicts as before the engines moved into
// packages: /version names vLLM whatever /models says; otherwise /models'
// owned_by names the kind; an unnamed /models is an OpenAI-compatible
// server; no /models is not known yet. Each document is fetched once.
func TestIdentify(t *testing.T) {
	f := func(pages map[string]string, want openai.Kind, wantOK bool) {
		t.Helper()
		fetches := map[string]int{}
		got, ok := engines.Identify(docs(pages, fetches))
		if got != want || ok != wantOK {
			t.Fatalf("%v: Identify = %s, %v; want %s, %v", pages, got, ok, want, wantOK)
		}
		for p, n := range fetches {
			if n > 1 {
				t.Fatalf("%s fetched %d times", p, n)
			}
		}
	}
	models := func(owner string) string { return `{"data":[{"id":"m","owned_by":"` + owner + `"}]}` }
	f(map[string]string{"/version": `{"version":"0.32.0"}`, "/v1/models": models("sglang")}, openai.KindVLLM, true)
	fetches := map[string]int{}
	engines.Identify(docs(map[string]string{"/version": `{"version":"0.32.0"}`}, fetches))
	if fetches["/v1/models"] != 0 {
		t.Fatal("a replica that /version names is asked for /models too")
	}
	f(map[string]string{"/v1/models": models("vllm")}, openai.KindVLLM, true)
	f(map[string]string{"/v1/models": models("SGLang")}, openai.KindSGLang, true)
	f(map[string]string{"/v1/models": models("llamacpp")}, openai.KindLlamaCpp, true)
	f(map[string]string{"/v1/models": models("openai")}, openai.KindOpenAI, true)
	f(map[string]string{"/version": `{"v":1}`}, openai.KindOpenAI, false)
	f(map[string]string{}, openai.KindOpenAI, false)
}

// TestEveryKindRegistered: the four built-in kinds are registered, their
// injections are what the gateway relied on, and a kind nobody registered
// injects nothing.
func TestEveryKindRegistered(t *testing.T) {
	for _, k := range []openai.Kind{openai.KindVLLM, openai.KindSGLang, openai.KindOpenAI, openai.KindLlamaCpp} {
		if e := engines.Lookup(k); e == nil || e.Kind() != k || engines.InjectOf(k) != e.Inject() {
			t.Fatalf("kind %s: engine %v", k, e)
		}
	}
	if !engines.InjectOf(openai.KindOpenAI).Nothing || !engines.InjectOf(200).Nothing || engines.Lookup(200) != nil {
		t.Fatal("openai and unregistered kinds must inject nothing")
	}
	if _, ok := engines.Lookup(openai.KindVLLM).(engines.TokenIn); !ok {
		t.Fatal("vllm has token-in")
	}
	for _, k := range []openai.Kind{openai.KindSGLang, openai.KindLlamaCpp, openai.KindOpenAI} {
		if _, ok := engines.Lookup(k).(engines.TokenIn); ok {
			t.Fatalf("%s has no token-in", k)
		}
	}
	if engines.Filler(openai.KindVLLM, "http://h/v1") == nil || engines.Filler(openai.KindLlamaCpp, "http://h/v1") == nil ||
		engines.Filler(openai.KindSGLang, "http://h/v1") != nil || engines.Filler(openai.KindOpenAI, "http://h/v1") != nil {
		t.Fatal("id fillers: vllm and llamacpp only, as the gateway gave them before")
	}
}
