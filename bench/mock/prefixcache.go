package mock

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// The prefix-cache model (Config.PrefixCacheBlocks > 0): what vLLM's
// automatic prefix caching does to time to first token, so that routing
// policies can be compared on the mock.
//
// As vLLM's v1 KV-cache manager (vllm/v1/core/kv_cache_utils.py,
// hash_block_tokens and request_block_hasher; vllm/v1/core/kv_cache_manager.py,
// get_computed_blocks; read at vllm-project/vllm@001cabc1be16a59a70d720ed61a13b678c060a18):
//   - a prompt's token ids are cut into blocks of PrefixBlockSize tokens (vLLM's
//     default block size, 16); only full blocks are cached;
//   - each block's hash chains its parent's hash with the block's ids, so a
//     block hits only when the whole prefix before it is the same;
//   - a request's hit is the longest run of leading cached blocks, at most
//     (prompt tokens - 1) tokens: the last token is always computed, for
//     its logits (max_cache_hit_length = num_tokens - 1);
//   - blocks are evicted least recently used first (the free block queue);
//   - the hit is reported as usage.prompt_tokens_details.cached_tokens when
//     non-zero (vLLM does so with --enable-prompt-tokens-details; see
//     serving_chat.py), and counted in tokens as vLLM's /metrics counters
//     vllm:prefix_cache_queries and vllm:prefix_cache_hits.
//
// Simplified: only prompt blocks are inserted (vLLM also caches full blocks
// of generated tokens), once a request is admitted rather than as its
// prefill progresses; the capacity is a block count, not GPU memory; one
// cache per mock server, i.e. per engine replica.
//
// Time to first token is then TTFT + PrefillPerToken × (prompt tokens not
// served from the cache): prefill work grows with the uncached tokens.

// PrefixBlockSize is the prefix-cache model's block size in tokens (vLLM's default).
const PrefixBlockSize = 16

// prefixCache is an LRU set of block hashes with a fixed capacity; its
// entries live in one slice linked into a recency list, so lookups and
// inserts allocate nothing once it is full.
type prefixCache struct {
	mu      sync.Mutex
	index   map[uint64]int32 // block hash → entry
	entries []pcEntry
	head    int32 // most recently used, -1 when empty
	tail    int32 // least recently used

	queries atomic.Int64 // prompt tokens looked up
	hits    atomic.Int64 // prompt tokens served from the cache
}

type pcEntry struct {
	hash       uint64
	prev, next int32
}

func newPrefixCache(blocks int) *prefixCache {
	return &prefixCache{index: make(map[uint64]int32, blocks), entries: make([]pcEntry, 0, blocks), head: -1, tail: -1}
}

// unlink takes entry i out of the recency list.
func (c *prefixCache) unlink(i int32) {
	e := &c.entries[i]
	if e.prev >= 0 {
		c.entries[e.prev].next = e.next
	} else {
		c.head = e.next
	}
	if e.next >= 0 {
		c.entries[e.next].prev = e.prev
	} else {
		c.tail = e.prev
	}
}

// pushFront makes entry i the most recently used.
func (c *prefixCache) pushFront(i int32) {
	e := &c.entries[i]
	e.prev, e.next = -1, c.head
	if c.head >= 0 {
		c.entries[c.head].prev = i
	}
	c.head = i
	if c.tail < 0 {
		c.tail = i
	}
}

// touch reports whether hash is cached, and if so marks it most recently used.
func (c *prefixCache) touch(hash uint64) bool {
	i, ok := c.index[hash]
	if ok && c.head != i {
		c.unlink(i)
		c.pushFront(i)
	}
	return ok
}

// insert caches hash (already known not to be cached), evicting the least
// recently used block when full.
func (c *prefixCache) insert(hash uint64) {
	var i int32
	if len(c.entries) < cap(c.entries) {
		c.entries = append(c.entries, pcEntry{})
		i = int32(len(c.entries) - 1)
	} else {
		i = c.tail
		c.unlink(i)
		delete(c.index, c.entries[i].hash)
	}
	c.entries[i].hash = hash
	c.index[hash] = i
	c.pushFront(i)
}

// lookup returns how many leading tokens of ids are served from the cache,
// and caches ids' full blocks.
func (c *prefixCache) lookup(ids []uint32) int {
	maxHit := 0
	if len(ids) > 0 {
		maxHit = (len(ids) - 1) / PrefixBlockSize
	}
	h := uint64(fnvOffset)
	hit, hitting := 0, true
	c.mu.Lock()
	for b := 0; (b+1)*PrefixBlockSize <= len(ids); b++ {
		bh := hasher(h)
		bh.ids(ids[b*PrefixBlockSize : (b+1)*PrefixBlockSize])
		h = mix64(uint64(bh))
		cached := c.touch(h)
		switch {
		case hitting && cached && b < maxHit:
			hit++
		case !cached:
			c.insert(h)
			hitting = false
		default:
			hitting = false
		}
	}
	c.mu.Unlock()
	c.queries.Add(int64(len(ids)))
	c.hits.Add(int64(hit * PrefixBlockSize))
	return hit * PrefixBlockSize
}

// prefill applies the prefix-cache model to the plan's prompts: it records
// the cached tokens (p.cached) and adds the uncached tokens' prefill time to
// the time to first token. A no-op when both the model and
// PrefillPerToken are off.
func (p *plan) prefill() {
	pc, per := p.s.pc, p.s.cfg.PrefillPerToken
	if pc == nil && per == 0 {
		return
	}
	uncached := 0
	for i := range p.numPrompts() {
		ids := p.prompt(i)
		n := 0
		if pc != nil {
			n = pc.lookup(ids)
		}
		p.cached += n
		uncached += len(ids) - n
	}
	p.k.ttft += time.Duration(uncached) * per
}

// appendUsageOf appends the usage object of vLLM: appendUsage, plus
// prompt_tokens_details when the prefix-cache model served tokens.
func (p *plan) appendUsageOf(dst []byte) []byte {
	dst = appendUsage(dst, p.promptTokens(), p.completionTokens())
	if p.cached == 0 {
		return dst
	}
	dst = append(dst[:len(dst)-1], `,"prompt_tokens_details":{"cached_tokens":`...)
	dst = strconv.AppendInt(dst, int64(p.cached), 10)
	return append(dst, "}}"...)
}

// PrefixCacheQueries returns how many prompt tokens were looked up in the
// prefix-cache model (vLLM's vllm:prefix_cache_queries); 0 when it is off.
func (s *Server) PrefixCacheQueries() int64 {
	if s.pc == nil {
		return 0
	}
	return s.pc.queries.Load()
}

// PrefixCacheHits returns how many prompt tokens the prefix-cache model
// served (vLLM's vllm:prefix_cache_hits); 0 when it is off.
func (s *Server) PrefixCacheHits() int64 {
	if s.pc == nil {
		return 0
	}
	return s.pc.hits.Load()
}

// resetPrefixCache empties the prefix cache (POST /reset_prefix_cache), as
// vLLM does; the counters keep counting.
func (s *Server) resetPrefixCache() {
	pc := s.pc
	if pc == nil {
		return
	}
	pc.mu.Lock()
	clear(pc.index)
	pc.entries = pc.entries[:0]
	pc.head, pc.tail = -1, -1
	pc.mu.Unlock()
}

// writeMetrics answers GET /metrics in the Prometheus text format with the
// prefix-cache counters, named as vLLM's.
func (s *Server) writeMetrics(ctx *fasthttp.RequestCtx) {
	b := []byte("# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.\n# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{model_name=")
	b = strconv.AppendQuote(b, s.cfg.Model)
	b = append(b, "} "...)
	b = strconv.AppendInt(b, s.PrefixCacheQueries(), 10)
	b = append(b, "\n# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.\n# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{model_name="...)
	b = strconv.AppendQuote(b, s.cfg.Model)
	b = append(b, "} "...)
	b = strconv.AppendInt(b, s.PrefixCacheHits(), 10)
	b = append(b, '\n')
	ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
	ctx.SetBody(b)
}
