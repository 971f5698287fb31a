package gateway

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/tokenize/fallback"
)

// replica is one backend server in the live routing table. Its counters are
// atomics so in-flight calls keep working on it after a table swap.
type replica struct {
	spec     Replica
	name     string
	origin   string // scheme://host[:port]
	basePath string // path of the base URL without trailing slash, e.g. "/v1"
	client   *fasthttp.HostClient
	auth     string // "Bearer ..." of the start-time key APIKeyEnv names, or ""
	key      uint64 // hash of spec.URL: the replica's identity in rendezvous hashing (affinity.go)

	outstanding atomic.Int64

	// Health: consecutive failures and the time (unix ns) until which the
	// replica is left out of selection.
	fails          atomic.Int32
	unhealthyUntil atomic.Int64

	filler      *fallback.Client // id filler for vLLM replicas
	llamaFiller *fallback.Client // id filler for llama.cpp replicas

	// kind is resolved once for kind "auto"; kindOK is 0 until then.
	kindMu      sync.Mutex
	kind        atomic.Uint32
	kindOK      atomic.Bool
	nextProbeAt atomic.Int64

	// A vLLM replica's version decides how it gives token ids (TokenIDs
	// "auto"): oldVLLM once verOK, probed like the kind.
	oldVLLM        atomic.Bool
	verOK          atomic.Bool
	nextVerProbeAt atomic.Int64
}

// idsFromLogprobs reports whether token ids must be asked of this replica
// through logprobs (vLLM before 0.10.2 ignores return_token_ids).
func (r *replica) idsFromLogprobs(kind openai.Kind) bool {
	if kind != openai.KindVLLM {
		return false
	}
	switch r.spec.TokenIDs {
	case "logprobs":
		return true
	case "engine":
		return false
	}
	if r.verOK.Load() {
		return r.oldVLLM.Load()
	}
	now := time.Now().UnixNano()
	if now < r.nextVerProbeAt.Load() || !r.kindMu.TryLock() {
		return false
	}
	defer r.kindMu.Unlock()
	r.nextVerProbeAt.Store(now + int64(5*time.Second))
	if st, body := r.get("/version"); st == 200 {
		if v := gjson.GetBytes(body, "version"); v.Exists() {
			r.oldVLLM.Store(versionBefore(v.String(), 0, 10, 2))
			r.verOK.Store(true)
		}
	}
	return r.oldVLLM.Load()
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

// pool is the set of replicas serving one model.
type pool struct {
	model    string
	replicas []*replica
	sel      Selector      // the pool's routing policy (affinity.go)
	next     atomic.Uint64 // rotates the starting point of ties
}

type replicaKey struct {
	model string
	spec  Replica
}

// table is an immutable routing table; the server swaps whole tables.
type table struct {
	spec     []Backend
	pools    map[string]*pool
	wildcard *pool
}

// Selector picks a replica of a pool for one call of rollout (nil when the
// call names none), skipping those in exclude (already tried for this call),
// and says how it chose. It returns nil when none is left.
type Selector interface {
	Select(p *pool, rollout []byte, exclude []*replica) (*replica, RouteOutcome)
}

// LeastOutstanding picks the healthy replica with the fewest outstanding
// requests relative to its weight; ties rotate. When every candidate is
// unhealthy it still picks one (the least loaded), so a pool never refuses
// calls only because checks failed.
type LeastOutstanding struct{}

// Select implements Selector; the rollout plays no part.
func (LeastOutstanding) Select(p *pool, _ []byte, exclude []*replica) (*replica, RouteOutcome) {
	now := time.Now().UnixNano()
	if r := leastLoaded(p, exclude, now, true); r != nil {
		return r, RouteUncounted
	}
	return leastLoaded(p, exclude, now, false), RouteUncounted
}

func leastLoaded(p *pool, exclude []*replica, now int64, healthyOnly bool) *replica {
	n := len(p.replicas)
	start := int(p.next.Add(1) % uint64(n))
	var best *replica
	var bestLoad int64
	for i := range n {
		r := p.replicas[(start+i)%n]
		if slices.Contains(exclude, r) || (healthyOnly && r.unhealthyUntil.Load() > now) {
			continue
		}
		w := int64(r.spec.Weight)
		if w <= 0 {
			w = 1
		}
		load := r.outstanding.Load() * 1000 / w
		if best == nil || load < bestLoad {
			best, bestLoad = r, load
		}
	}
	return best
}

var _ Selector = LeastOutstanding{}

// lookup returns the pool serving model, or nil.
func (t *table) lookup(model string) *pool {
	if p, ok := t.pools[model]; ok {
		return p
	}
	return t.wildcard
}

// models lists the configured model names (not "*"), sorted.
func (t *table) models() []string {
	out := make([]string, 0, len(t.pools))
	for m := range t.pools {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// clientCache keeps one HostClient per origin so connections survive table swaps.
type clientCache struct {
	mu      sync.Mutex
	clients map[string]*fasthttp.HostClient
	cfg     *Config
	// transport is every client's RoundTripper: non-streamed calls whose
	// client hangs up are cancelled through it (see hangup.go).
	transport hangupTransport
}

func (c *clientCache) get(u *url.URL) *fasthttp.HostClient {
	key := u.Scheme + "://" + u.Host
	c.mu.Lock()
	defer c.mu.Unlock()
	if hc, ok := c.clients[key]; ok {
		return hc
	}
	addr := u.Host
	isTLS := u.Scheme == "https"
	if u.Port() == "" {
		if isTLS {
			addr += ":443"
		} else {
			addr += ":80"
		}
	}
	connectTimeout, idle := c.cfg.ConnectTimeout, c.cfg.IdleTimeout
	hc := &fasthttp.HostClient{
		Addr:      addr,
		IsTLS:     isTLS,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12},
		// Responses stream only when the call asked for a stream (proxy sets
		// Response.StreamBody); other bodies are read whole into pooled buffers.
		StreamResponseBody:            false,
		MaxConns:                      16384,
		MaxIdleConnDuration:           90 * time.Second,
		MaxResponseBodySize:           c.cfg.MaxResponseBodyBytes,
		ReadBufferSize:                8 << 10, // response headers; bodies stream past it
		WriteBufferSize:               4 << 10,
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
		Transport:                     &c.transport,
		Dial: func(addr string) (net.Conn, error) {
			conn, err := fasthttp.DialTimeout(addr, connectTimeout)
			if err != nil {
				return nil, err
			}
			return &idleConn{Conn: conn, idle: idle}, nil
		},
	}
	c.clients[key] = hc
	return hc
}

// buildTable turns a validated spec into a live table, carrying the counters
// and resolved kinds of replicas that are still present in old.
func buildTable(spec []Backend, old *table, cc *clientCache, keys *upstreamKeys) (*table, error) {
	if err := ValidateBackends(spec); err != nil {
		return nil, err
	}
	// A replica whose spec is unchanged keeps its object, so its load counter
	// and resolved kind carry over and in-flight calls stay accounted.
	prev := map[replicaKey]*replica{}
	if old != nil {
		for _, p := range old.allPools() {
			for _, r := range p.replicas {
				prev[replicaKey{p.model, r.spec}] = r
			}
		}
	}
	t := &table{spec: spec, pools: map[string]*pool{}}
	for _, b := range spec {
		sel, err := poolSelector(b, cc.cfg)
		if err != nil {
			return nil, err
		}
		p := &pool{model: b.Model, sel: sel}
		for _, rs := range b.Replicas {
			if rs.Weight == 0 {
				rs.Weight = 1
			}
			if rs.Kind == "" {
				rs.Kind = "auto"
			}
			if o, ok := prev[replicaKey{b.Model, rs}]; ok {
				p.replicas = append(p.replicas, o)
				continue
			}
			u, err := url.Parse(strings.TrimRight(rs.URL, "/"))
			if err != nil {
				return nil, fmt.Errorf("backend %q: url %q: %w", b.Model, rs.URL, err)
			}
			name := rs.Name
			if name == "" {
				name = u.Host + u.Path
			}
			r := &replica{
				spec:     rs,
				name:     name,
				origin:   u.Scheme + "://" + u.Host,
				basePath: u.Path,
				client:   cc.get(u),
				key:      replicaHashKey(rs.URL),
			}
			if rs.APIKeyEnv != "" {
				auth, err := keys.bearer(rs.APIKeyEnv, rs.URL)
				if err != nil {
					return nil, fmt.Errorf("backend %q replica %q: %w", b.Model, name, err)
				}
				r.auth = auth
			}
			r.filler = &fallback.Client{BaseURL: r.origin + r.basePath, Kind: openai.KindVLLM}
			r.llamaFiller = &fallback.Client{BaseURL: r.origin + r.basePath, Kind: openai.KindLlamaCpp}
			if k, err := openai.ParseKind(rs.Kind); err == nil {
				r.kind.Store(uint32(k))
				r.kindOK.Store(true)
			} else {
				// Probe in the background so the first call rarely waits for it.
				go r.resolveKind()
			}
			p.replicas = append(p.replicas, r)
		}
		if b.Model == "*" {
			t.wildcard = p
		} else {
			t.pools[b.Model] = p
		}
	}
	return t, nil
}

func (t *table) allPools() []*pool {
	out := make([]*pool, 0, len(t.pools)+1)
	for _, p := range t.pools {
		out = append(out, p)
	}
	if t.wildcard != nil {
		out = append(out, t.wildcard)
	}
	return out
}

// resolveKind returns the replica's backend kind, probing it once when its
// kind is "auto": GET /version answers on vLLM; otherwise /v1/models'
// owned_by names the engine. Until a probe succeeds the replica is treated
// as an OpenAI-compatible server (nothing injected), and probes are retried
// at most every 5 seconds.
func (r *replica) resolveKind() openai.Kind {
	if r.kindOK.Load() {
		return openai.Kind(r.kind.Load())
	}
	now := time.Now().UnixNano()
	if now < r.nextProbeAt.Load() || !r.kindMu.TryLock() {
		return openai.KindOpenAI
	}
	defer r.kindMu.Unlock()
	r.nextProbeAt.Store(now + int64(5*time.Second))
	k, ok := r.probe()
	if ok {
		r.kind.Store(uint32(k))
		r.kindOK.Store(true)
	}
	return k
}

// get fetches a small document from the replica's origin.
func (r *replica) get(path string) (int, []byte) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI(r.origin + path)
	req.Header.SetMethod(fasthttp.MethodGet)
	if r.auth != "" {
		req.Header.Set("Authorization", r.auth)
	}
	// The streaming client hands back a body stream; read it whole.
	if err := r.client.DoTimeout(req, resp, 3*time.Second); err != nil {
		fasthttp.ReleaseResponse(resp)
		return 0, nil
	}
	body, _ := readAll(resp, 1<<20)
	status := resp.StatusCode()
	fasthttp.ReleaseResponse(resp)
	return status, body
}

func (r *replica) probe() (openai.Kind, bool) {
	get := r.get
	if st, body := get("/version"); st == 200 && gjson.GetBytes(body, "version").Exists() {
		r.oldVLLM.Store(versionBefore(gjson.GetBytes(body, "version").String(), 0, 10, 2))
		r.verOK.Store(true)
		return openai.KindVLLM, true
	}
	st, body := get(r.basePath + "/models")
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

// markFailure records a failed call or check; after failThreshold
// consecutive failures the replica leaves selection for cooldown.
func (r *replica) markFailure(failThreshold int, cooldown time.Duration) {
	if int(r.fails.Add(1)) >= failThreshold {
		r.unhealthyUntil.Store(time.Now().Add(cooldown).UnixNano())
	}
}

// markSuccess records a successful call or check: the replica is healthy.
func (r *replica) markSuccess() {
	if r.fails.Load() != 0 {
		r.fails.Store(0)
	}
	if r.unhealthyUntil.Load() != 0 {
		r.unhealthyUntil.Store(0)
	}
}

// healthy reports whether the replica is in selection now.
func (r *replica) healthy() bool { return r.unhealthyUntil.Load() <= time.Now().UnixNano() }

// checkHealth asks the replica's engine whether it is up: GET /health on its
// origin (vLLM, SGLang), falling back to GET {base}/models for other servers.
func (r *replica) checkHealth(timeout time.Duration) bool {
	for _, path := range []string{"/health", r.basePath + "/models"} {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI(r.origin + path)
		req.Header.SetMethod(fasthttp.MethodGet)
		if r.auth != "" {
			req.Header.Set("Authorization", r.auth)
		}
		err := r.client.DoTimeout(req, resp, timeout)
		ok := err == nil && resp.StatusCode() == 200
		if err == nil {
			_, _ = readAll(resp, 1<<20)
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
		if ok {
			return true
		}
		if err != nil {
			return false // unreachable: no point trying another path
		}
	}
	return false
}
