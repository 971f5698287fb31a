package backends

import (
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
)

// UpstreamReport is what CheckUpstreams found of one replica.
type UpstreamReport struct {
	Model, Replica string
	URL            string // Upstream.URL
	// Status is the answer's HTTP status to GET {url}/models (0: no
	// answer: refused, timed out, not HTTP).
	Status int
	// Models are the ids it lists (at most 20).
	Models []string
	// Hint says what is likely wrong with the URL ("" when nothing).
	Hint string
}

// OK reports whether the replica answered its model list.
func (r *UpstreamReport) OK() bool { return r.Status == 200 }

// CheckUpstreams asks every replica of the current table, in parallel and
// once, for GET {url}/models (the OpenAI model list every kind serves) and
// reports what each answered. A replica that does not answer 200 is marked
// unreachable until a health check (CheckLoop) or a call succeeds
// (Unreachable).
func (s *Set) CheckUpstreams(timeout time.Duration) []UpstreamReport {
	var out []UpstreamReport
	var ups []*Upstream
	for _, p := range s.Load().Pools() {
		for _, u := range p.Replicas() {
			out = append(out, UpstreamReport{Model: p.Model(), Replica: u.Name(), URL: u.URL()})
			ups = append(ups, u)
		}
	}
	var wg sync.WaitGroup
	for i, u := range ups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &out[i]
			st, body := u.getTimeout(u.basePath+"/models", timeout)
			r.Status = st
			gjson.GetBytes(body, "data.#.id").ForEach(func(_, v gjson.Result) bool {
				r.Models = append(r.Models, v.String())
				return len(r.Models) < 20
			})
			u.unreachable.Store(st != 200)
			r.Hint = u.PathHint(st)
		}()
	}
	wg.Wait()
	return out
}

// PathHint explains a replica answer that suggests a wrong base URL: a
// URL without /v1 (rollgate sends calls to the URL + /chat/completions,
// and engines serve them under /v1), or a 404 to the model list. status is
// the answer's HTTP status (0: none).
func (u *Upstream) PathHint(status int) string {
	if !strings.HasSuffix(u.basePath, "/v1") {
		return "the URL " + u.URL() + " does not end in /v1: rollgate sends calls to it + /chat/completions, and vLLM, SGLang, llama.cpp and OpenAI serve them under /v1 (use " + u.origin + u.basePath + "/v1)"
	}
	if status == 404 {
		return "the engine answered 404 Not Found: is " + u.URL() + " its OpenAI base URL (http://HOST:PORT/v1)?"
	}
	return ""
}

// URL is the replica's base URL as shown in logs and answers: its origin
// and path, never credentials or a query the configuration may hold.
func (u *Upstream) URL() string { return u.origin + u.basePath }

// Unreachable reports whether the replica's last check (CheckUpstreams at
// start, then every health check) failed.
func (u *Upstream) Unreachable() bool { return u.unreachable.Load() }

// NoteBare404 records that the replica answered a call 404 without an
// OpenAI error body (a route the engine does not serve) and reports
// whether it is the first time, so the caller logs it once per replica.
func (u *Upstream) NoteBare404() bool { return !u.told404.Swap(true) }
