package backends

import (
	"io"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/internal/openai"
)

// IDsFromLogprobs reports whether token ids must be asked of this replica,
// of engine kind, through logprobs (an engines.Versioned kind whose version
// says so: vLLM before 0.10.2 ignores return_token_ids). The version is
// probed like the kind.
func (u *Upstream) IDsFromLogprobs(kind openai.Kind) bool {
	v, ok := engines.Lookup(kind).(engines.Versioned)
	if !ok {
		return false
	}
	switch u.spec.TokenIDs {
	case "logprobs":
		return true
	case "engine":
		return false
	}
	if u.verOK.Load() {
		return u.oldVLLM.Load()
	}
	now := time.Now().UnixNano()
	if now < u.nextVerProbeAt.Load() || !u.kindMu.TryLock() {
		return false
	}
	defer u.kindMu.Unlock()
	u.nextVerProbeAt.Store(now + int64(5*time.Second))
	if st, body := u.get(v.VersionPath()); st == 200 {
		u.noteVersion(v, body)
	}
	return u.oldVLLM.Load()
}

// noteVersion records what the version document body of v says.
func (u *Upstream) noteVersion(v engines.Versioned, body []byte) {
	if old, ok := v.IDsFromLogprobs(body); ok {
		u.oldVLLM.Store(old)
		u.verOK.Store(true)
	}
}

// Kind returns the replica's backend kind, probing it once when its kind is
// "auto": GET /version answers on vLLM; otherwise /v1/models' owned_by
// names the engine. Until a probe succeeds the replica is treated as an
// OpenAI-compatible server (nothing injected), and probes are retried at
// most every 5 seconds.
func (u *Upstream) Kind() openai.Kind {
	if u.kindOK.Load() {
		return openai.Kind(u.kind.Load())
	}
	now := time.Now().UnixNano()
	if now < u.nextProbeAt.Load() || !u.kindMu.TryLock() {
		return openai.KindOpenAI
	}
	defer u.kindMu.Unlock()
	u.nextProbeAt.Store(now + int64(5*time.Second))
	k, ok := u.probe()
	if ok {
		u.kind.Store(uint32(k))
		u.kindOK.Store(true)
	}
	return k
}

// get fetches a small document from the replica's origin.
func (u *Upstream) get(path string) (int, []byte) { return u.getTimeout(path, 3*time.Second) }

// getTimeout is get within timeout.
func (u *Upstream) getTimeout(path string, timeout time.Duration) (int, []byte) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI(u.origin + path)
	req.Header.SetMethod(fasthttp.MethodGet)
	if u.auth != "" {
		req.Header.Set("Authorization", u.auth)
	}
	if err := u.client.DoTimeout(req, resp, timeout); err != nil {
		fasthttp.ReleaseResponse(resp)
		return 0, nil
	}
	body := readBody(resp, 1<<20)
	status := resp.StatusCode()
	fasthttp.ReleaseResponse(resp)
	return status, body
}

// probe asks the registered engines which kind the replica is
// (engines.Identify), noting the version of a versioned kind on the way.
func (u *Upstream) probe() (openai.Kind, bool) {
	d := engines.NewDocs(u.basePath, u.get)
	k, ok := engines.Identify(d)
	if v, isV := engines.Lookup(k).(engines.Versioned); ok && isV {
		if st, body := d.Get(v.VersionPath()); st == 200 {
			u.noteVersion(v, body)
		}
	}
	return k, ok
}

// readBody returns a small response's body, at most limit bytes of it (the
// clients stream only what the proxy asks to stream, so it is usually read
// already).
func readBody(resp *fasthttp.Response, limit int64) []byte {
	bs := resp.BodyStream()
	if bs == nil {
		b := resp.Body()
		return append([]byte(nil), b[:min(int64(len(b)), limit)]...)
	}
	b, _ := io.ReadAll(io.LimitReader(bs, limit))
	return b
}
