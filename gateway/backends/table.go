package backends

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"iter"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/internal/openai"
)

// Upstream is one replica in the live routing table, as the proxy calls it.
// Its counters are atomics so in-flight calls keep working on it after a
// table swap. A replica whose configuration is unchanged keeps its Upstream
// across swaps.
type Upstream struct {
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
	// unreachable: the last check (CheckUpstreams, health checks) failed;
	// told404: a bare 404 of this replica was logged (startcheck.go).
	unreachable atomic.Bool
	told404     atomic.Bool

	base string // origin + basePath: the replica's base URL as capture's engine clients use it

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

// Name identifies the replica in captured rows, metrics and logs.
func (u *Upstream) Name() string { return u.name }

// Spec is the replica's configuration (Weight and Kind defaults filled).
func (u *Upstream) Spec() Replica { return u.spec }

// Origin is scheme://host[:port] of the replica's base URL.
func (u *Upstream) Origin() string { return u.origin }

// BasePath is the path of the replica's base URL without a trailing slash,
// e.g. "/v1".
func (u *Upstream) BasePath() string { return u.basePath }

// Client is the HTTP client of the replica's origin, shared by the replicas
// of that origin and kept across table swaps.
func (u *Upstream) Client() *fasthttp.HostClient { return u.client }

// Auth is the Authorization value ("Bearer ...") of the replica's upstream
// key (Replica.APIKeyEnv), or "".
func (u *Upstream) Auth() string { return u.auth }

// Acquire counts a call outstanding on the replica; Release ends it.
func (u *Upstream) Acquire() { u.outstanding.Add(1) }

// Release ends a call counted by Acquire.
func (u *Upstream) Release() { u.outstanding.Add(-1) }

// Outstanding is the number of calls the replica holds now.
func (u *Upstream) Outstanding() int64 { return u.outstanding.Load() }

// ResolvedKind is the replica's engine kind once known (configured, or found
// by the probe); ok is false until then.
func (u *Upstream) ResolvedKind() (kind openai.Kind, ok bool) {
	if !u.kindOK.Load() {
		return openai.KindOpenAI, false
	}
	return openai.Kind(u.kind.Load()), true
}

// Engine is the replica as capture's engine clients need it (its
// tokenizer and detokenizer endpoints, package engines): its kind and base
// URL once the kind is known; the zero value until then. It allocates
// nothing.
func (u *Upstream) Engine() engines.Replica {
	k, ok := u.ResolvedKind()
	if !ok {
		return engines.Replica{}
	}
	return engines.Replica{Kind: k, BaseURL: u.base}
}

// Pool is the set of replicas serving one model.
type Pool struct {
	model    string
	replicas []*Upstream
	sel      Selector      // the pool's routing policy (affinity.go)
	next     atomic.Uint64 // rotates the starting point of ties
	tokenIn  *bool         // Backend.TokenIn
}

// TokenIn is the pool's Backend.TokenIn: nil when the gateway's setting
// applies.
func (p *Pool) TokenIn() *bool { return p.tokenIn }

// Model is the routed model name ("*" for the wildcard pool).
func (p *Pool) Model() string { return p.model }

// Replicas are the pool's replicas, in configuration order. The slice must
// not be modified.
func (p *Pool) Replicas() []*Upstream { return p.replicas }

// Select picks the replica for a call of rollout (nil when the call names
// none), skipping those in exclude, by the pool's routing policy; nil when
// every replica is excluded. It allocates nothing.
func (p *Pool) Select(rollout []byte, exclude []*Upstream) (*Upstream, RouteOutcome) {
	return p.sel.Select(p, rollout, exclude)
}

type replicaKey struct {
	model string
	spec  Replica
}

// Table is an immutable routing table; Set swaps whole tables.
type Table struct {
	spec     []Backend
	pools    map[string]*Pool
	wildcard *Pool
}

// Pool returns the pool routing exactly model (not the wildcard), or nil.
// It allocates nothing.
func (t *Table) Pool(model []byte) *Pool { return t.pools[string(model)] }

// Wildcard returns the pool of model "*", or nil.
func (t *Table) Wildcard() *Pool { return t.wildcard }

// Lookup returns the pool serving model: its own, else the wildcard, else nil.
func (t *Table) Lookup(model string) *Pool {
	if p, ok := t.pools[model]; ok {
		return p
	}
	return t.wildcard
}

// Empty reports whether the table routes nothing.
func (t *Table) Empty() bool { return len(t.pools) == 0 && t.wildcard == nil }

// Models lists the configured model names (not "*"), sorted.
func (t *Table) Models() []string {
	out := make([]string, 0, len(t.pools))
	for m := range t.pools {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// Pools lists every pool, the wildcard last.
func (t *Table) Pools() []*Pool {
	out := make([]*Pool, 0, len(t.pools)+1)
	for _, p := range t.pools {
		out = append(out, p)
	}
	if t.wildcard != nil {
		out = append(out, t.wildcard)
	}
	return out
}

// InFlight is the number of calls outstanding on all replicas.
func (t *Table) InFlight() int64 {
	var n int64
	for _, p := range t.Pools() {
		for _, r := range p.replicas {
			n += r.outstanding.Load()
		}
	}
	return n
}

// Named yields the replicas named name (Replica.Name, else host and path
// of its URL), of every pool.
func (t *Table) Named(name string) iter.Seq[*Upstream] {
	return func(yield func(*Upstream) bool) {
		for _, p := range t.Pools() {
			for _, r := range p.replicas {
				if r.name == name && !yield(r) {
					return
				}
			}
		}
	}
}

// View describes the table's pools for GET /api/v1/backends.
func (t *Table) View() []PoolView {
	out := []PoolView{}
	for _, b := range t.spec {
		p := t.Lookup(b.Model)
		if b.Model == "*" {
			p = t.wildcard
		}
		v := PoolView{Model: b.Model}
		v.Routing, v.LoadFactor = routingOf(p.sel)
		for _, r := range p.replicas {
			rv := ReplicaView{Replica: r.spec, Outstanding: r.outstanding.Load(), Healthy: r.Healthy()}
			if k, ok := r.ResolvedKind(); ok {
				rv.ResolvedKind = k.String()
			}
			v.Replicas = append(v.Replicas, rv)
		}
		out = append(out, v)
	}
	return out
}

// ClientConfig says how the HTTP clients of backend origins are made.
type ClientConfig struct {
	// MaxResponseBodyBytes bounds a response read whole (not streamed).
	MaxResponseBodyBytes int
	// ReadBufferSize is each connection's read buffer (0: 8 KiB): response
	// headers must fit, and a streamed body is read through it.
	ReadBufferSize int
	// Transport is every client's RoundTripper (nil: fasthttp's default).
	Transport fasthttp.RoundTripper
	// Dial opens a connection to a backend (nil: fasthttp's default dialer).
	Dial fasthttp.DialFunc
}

// clientCache keeps one HostClient per origin so connections survive table swaps.
type clientCache struct {
	mu      sync.Mutex
	clients map[string]*fasthttp.HostClient
	cfg     ClientConfig
}

func (c *clientCache) get(u *url.URL) *fasthttp.HostClient {
	key := u.Scheme + "://" + u.Host
	c.mu.Lock()
	defer c.mu.Unlock()
	if hc, ok := c.clients[key]; ok {
		return hc
	}
	if c.clients == nil {
		c.clients = map[string]*fasthttp.HostClient{}
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
	hc := &fasthttp.HostClient{
		Addr:      addr,
		IsTLS:     isTLS,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12},
		// Responses stream only when the call asked for a stream (the proxy
		// sets Response.StreamBody); other bodies are read whole into pooled
		// buffers.
		StreamResponseBody:            false,
		MaxConns:                      16384,
		MaxIdleConnDuration:           90 * time.Second,
		MaxResponseBodySize:           c.cfg.MaxResponseBodyBytes,
		ReadBufferSize:                cmp.Or(c.cfg.ReadBufferSize, 8<<10), // response headers; streamed bodies pass through it
		WriteBufferSize:               4 << 10,
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
		Transport:                     c.cfg.Transport,
		Dial:                          c.cfg.Dial,
	}
	c.clients[key] = hc
	return hc
}

// buildTable turns a validated spec into a live table, carrying the counters
// and resolved kinds of replicas that are still present in old. routing and
// loadFactor are the defaults of pools that set none ("" and 0: affine,
// DefaultRoutingLoadFactor).
func buildTable(spec []Backend, old *Table, cc *clientCache, keys *UpstreamKeys, routing string, loadFactor float64) (*Table, error) {
	if err := Validate(spec); err != nil {
		return nil, err
	}
	// A replica whose spec is unchanged keeps its object, so its load counter
	// and resolved kind carry over and in-flight calls stay accounted.
	prev := map[replicaKey]*Upstream{}
	if old != nil {
		for _, p := range old.Pools() {
			for _, r := range p.replicas {
				prev[replicaKey{p.model, r.spec}] = r
			}
		}
	}
	t := &Table{spec: spec, pools: map[string]*Pool{}}
	for _, b := range spec {
		sel, err := poolSelector(b, routing, loadFactor)
		if err != nil {
			return nil, err
		}
		p := &Pool{model: b.Model, sel: sel, tokenIn: b.TokenIn}
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
			r := &Upstream{
				spec:     rs,
				name:     name,
				origin:   u.Scheme + "://" + u.Host,
				basePath: u.Path,
				client:   cc.get(u),
				key:      replicaHashKey(rs.URL),
			}
			if rs.APIKeyEnv != "" {
				if keys == nil {
					keys = &UpstreamKeys{}
				}
				auth, err := keys.Bearer(rs.APIKeyEnv, rs.URL)
				if err != nil {
					return nil, fmt.Errorf("backend %q replica %q: %w", b.Model, name, err)
				}
				r.auth = auth
			}
			r.base = r.origin + r.basePath
			if k, err := openai.ParseKind(rs.Kind); err == nil {
				r.kind.Store(uint32(k))
				r.kindOK.Store(true)
			} else {
				// Probe in the background so the first call rarely waits for it.
				go r.Kind()
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

// Options configure a Set.
type Options struct {
	// Routing and LoadFactor are the policy of pools that set none (see
	// gateway.Config.Routing and RoutingLoadFactor); "" and 0 take the
	// defaults (affine, DefaultRoutingLoadFactor).
	Routing    string
	LoadFactor float64
	// Keys are the upstream API keys replicas may name (nil: none).
	Keys *UpstreamKeys
	// Client makes the HTTP clients of backend origins.
	Client ClientConfig
}

// Set is the live routing table: the current Table, which the proxy loads
// on every call and ReplaceBackends swaps whole, and what outlives a swap
// (one HTTP client per origin, the upstream keys).
type Set struct {
	opts    Options
	table   atomic.Pointer[Table]
	mu      sync.Mutex // serialises Replace
	clients clientCache
}

// New builds the set serving spec. The error says which entry of spec is
// wrong.
func New(spec []Backend, opts Options) (*Set, error) {
	s := &Set{opts: opts, clients: clientCache{cfg: opts.Client}}
	t, err := buildTable(spec, nil, &s.clients, opts.Keys, opts.Routing, opts.LoadFactor)
	if err != nil {
		return nil, err
	}
	s.table.Store(t)
	return s, nil
}

// Load returns the current table. It allocates nothing.
func (s *Set) Load() *Table { return s.table.Load() }

// Replace swaps in a table serving spec. In-flight calls keep the replica
// they were sent to; replicas whose configuration is unchanged keep their
// counters, health and resolved kind. The error says what is wrong with
// spec; the table is then unchanged.
func (s *Set) Replace(spec []Backend) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := buildTable(spec, s.table.Load(), &s.clients, s.opts.Keys, s.opts.Routing, s.opts.LoadFactor)
	if err != nil {
		return err
	}
	s.table.Store(t)
	return nil
}
