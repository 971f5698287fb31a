package gateway

import (
	"bytes"
	"math/rand/v2"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/capture"
)

// attribution says which rollout, attempt, task and agent a call belongs to.
// The fields are views into the request (path or headers), valid while the
// request is being served; beginCall turns them into long-lived strings
// without allocating in steady state (see sequences and interner).
type attribution struct {
	rolloutID []byte
	attemptID []byte
	taskID    []byte
	agentName []byte
	fromPath  bool // the ids came from the /rollout/{r}/attempt/{a} prefix
}

// attributionOf reads a request's attribution (path prefix first, then
// headers) and returns it with the path that follows the rollout prefix.
func attributionOf(ctx *fasthttp.RequestCtx) (attr attribution, path []byte) {
	path = ctx.Path()
	h := &ctx.Request.Header
	if r, a, rest, ok := splitRolloutPath(path); ok {
		attr.rolloutID, attr.attemptID, attr.fromPath = r, a, true
		path = rest
	} else if v := h.Peek("x-rollout-id"); len(v) > 0 {
		attr.rolloutID, attr.attemptID = v, h.Peek("x-attempt-id")
	}
	attr.taskID = h.Peek("x-task-id")
	attr.agentName = h.Peek("x-agent-name")
	return attr, path
}

var (
	prefixRollout = []byte("/rollout/")
	segAttempt    = []byte("/attempt/")
)

// splitRolloutPath parses "/rollout/{r}/attempt/{a}/rest..." and returns r, a
// and "/rest...". ok is false when path does not have that prefix or an id is empty.
func splitRolloutPath(path []byte) (rollout, attempt, rest []byte, ok bool) {
	if !bytes.HasPrefix(path, prefixRollout) {
		return nil, nil, path, false
	}
	p := path[len(prefixRollout):]
	i := bytes.IndexByte(p, '/')
	if i <= 0 {
		return nil, nil, path, false
	}
	rollout, p = p[:i], p[i:]
	if !bytes.HasPrefix(p, segAttempt) {
		return nil, nil, path, false
	}
	p = p[len(segAttempt):]
	i = bytes.IndexByte(p, '/')
	if i == 0 {
		return nil, nil, path, false
	}
	if i < 0 {
		if len(p) == 0 {
			return nil, nil, path, false
		}
		return rollout, p, []byte{}, true
	}
	return rollout, p[:i], p[i:], true
}

// interner returns one shared string per distinct byte string, so values
// that repeat on every call (model names of a wildcard route, task and agent
// names) are not allocated per call. It is bounded: it holds at most max
// strings and maxBytes bytes of them, and starts over when either is reached;
// a value longer than maxLen is returned as a fresh copy, never kept.
type interner struct {
	mu       sync.RWMutex
	m        map[string]string
	bytes    int
	max      int
	maxBytes int
	maxLen   int
}

// internerOverhead approximates a map entry's cost beyond its string bytes.
const internerOverhead = 64

func (in *interner) get(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if len(b) > in.maxLen {
		return string(b)
	}
	in.mu.RLock()
	v, ok := in.m[string(b)]
	in.mu.RUnlock()
	if ok {
		return v
	}
	v = string(b)
	in.mu.Lock()
	if in.m == nil || len(in.m) >= in.max || in.bytes+len(v)+internerOverhead > in.maxBytes {
		in.m, in.bytes = make(map[string]string, 64), 0
	}
	if _, ok := in.m[v]; !ok {
		in.m[v] = v
		in.bytes += len(v) + internerOverhead
	}
	in.mu.Unlock()
	return v
}

// size returns the number of strings held and their accounted bytes.
func (in *interner) size() (n, bytes int) {
	in.mu.RLock()
	defer in.mu.RUnlock()
	return len(in.m), in.bytes
}

// fillIDs writes a new random span id, and the trace and parent span ids of
// a W3C traceparent header ("00-<32 hex>-<16 hex>-<2 hex>") or a new random
// trace id, into ids.
func fillIDs(ids *capture.CallIDs, traceparent []byte) {
	putHex(ids.Span[:], rand.Uint64())
	ids.Set = true
	if len(traceparent) >= 55 && traceparent[2] == '-' && traceparent[35] == '-' {
		tid := traceparent[3:35]
		if isLowerHex(tid) && !bytes.Equal(tid, zeroTraceID) {
			copy(ids.Trace[:], tid)
			if pid := traceparent[36:52]; traceparent[52] == '-' && isLowerHex(pid) && string(pid) != "0000000000000000" {
				copy(ids.Parent[:], pid)
				ids.HasParent = true
			}
			return
		}
	}
	putHex(ids.Trace[:16], rand.Uint64())
	putHex(ids.Trace[16:], rand.Uint64())
}

// putHex writes v as 16 lowercase hex digits into dst.
func putHex(dst []byte, v uint64) {
	const digits = "0123456789abcdef"
	for i := 15; i >= 0; i-- {
		dst[i] = digits[v&0xf]
		v >>= 4
	}
}

var zeroTraceID = bytes.Repeat([]byte{'0'}, 32)

func isLowerHex(b []byte) bool {
	for _, c := range b {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
