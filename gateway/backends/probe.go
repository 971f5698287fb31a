package backends

import (
	"io"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/internal/openai"
)

// IDsFromLogprobs reports whether token ids must be asked of this replica,
// of engine kind, through logprobs (vLLM before 0.10.2 ignores
// return_token_ids).
func (u *Upstream) IDsFromLogprobs(kind openai.Kind) bool {
	if kind != openai.KindVLLM {
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
	if st, body := u.get("/version"); st == 200 {
		if v := gjson.GetBytes(body, "version"); v.Exists() {
			u.oldVLLM.Store(versionBefore(v.String(), 0, 10, 2))
			u.verOK.Store(true)
		}
	}
	return u.oldVLLM.Load()
}

// versionBefore reports whether a version string such as "0.9.2",
// "0.10.1.1" or "0.11.0.dev12+gabc" is older than major.minor.patch. An
// unreadable version counts as new.
func versionBefore(v string, major, minor, patch int) bool {
	var nums [3]int
	for i := range nums {
		j := 0
		for j < len(v) && v[j] >= '0' && v[j] <= '9' {
			nums[i] = nums[i]*10 + int(v[j]-'0')
			j++
		}
		if j == 0 {
			if i == 0 {
				return false // not a version number
			}
			break
		}
		v = v[j:]
		if i < 2 {
			if len(v) == 0 || v[0] != '.' {
				break
			}
			v = v[1:]
		}
	}
	want := [3]int{major, minor, patch}
	for i := range nums {
		if nums[i] != want[i] {
			return nums[i] < want[i]
		}
	}
	return false
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

func (u *Upstream) probe() (openai.Kind, bool) {
	get := u.get
	if st, body := get("/version"); st == 200 && gjson.GetBytes(body, "version").Exists() {
		u.oldVLLM.Store(versionBefore(gjson.GetBytes(body, "version").String(), 0, 10, 2))
		u.verOK.Store(true)
		return openai.KindVLLM, true
	}
	st, body := get(u.basePath + "/models")
	if st != 200 {
		return openai.KindOpenAI, false
	}
	switch strings.ToLower(gjson.GetBytes(body, "data.0.owned_by").String()) {
	case "vllm":
		return openai.KindVLLM, true
	case "sglang":
		return openai.KindSGLang, true
	case "llamacpp":
		return openai.KindLlamaCpp, true
	}
	return openai.KindOpenAI, true
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
