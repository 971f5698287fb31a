package gateway

import (
	"bytes"
	"encoding/hex"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// attribution says which rollout, attempt, task and agent a call belongs to.
type attribution struct {
	rolloutID string
	attemptID string
	taskID    string
	agentName string
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

// sequences allocates per-(rollout, attempt) sequence ids: strictly
// increasing from 1, never reused while the gateway runs, independent of clocks.
type sequences struct {
	m sync.Map // key string → *atomic.Uint64
}

// next returns the next sequence id of (rollout, attempt).
func (s *sequences) next(rollout, attempt string) uint64 {
	key := rollout + "\x00" + attempt
	if c, ok := s.m.Load(key); ok {
		return c.(*atomic.Uint64).Add(1)
	}
	c, _ := s.m.LoadOrStore(key, new(atomic.Uint64))
	return c.(*atomic.Uint64).Add(1)
}

// newSpanID returns 16 random hex characters (a W3C span id).
func newSpanID() string {
	var b [8]byte
	putUint64(b[:], rand.Uint64())
	return hex.EncodeToString(b[:])
}

// traceIDFrom returns the trace id of a W3C traceparent header
// ("00-<32 hex>-<16 hex>-<2 hex>"), or a new random one.
func traceIDFrom(traceparent []byte) string {
	if len(traceparent) >= 55 && traceparent[2] == '-' && traceparent[35] == '-' {
		id := traceparent[3:35]
		if isLowerHex(id) && !bytes.Equal(id, zeroTraceID) {
			return string(id)
		}
	}
	var b [16]byte
	putUint64(b[:8], rand.Uint64())
	putUint64(b[8:], rand.Uint64())
	return hex.EncodeToString(b[:])
}

// parentSpanFrom returns the parent span id of a valid W3C traceparent, or "".
func parentSpanFrom(traceparent []byte) string {
	if len(traceparent) >= 55 && traceparent[2] == '-' && traceparent[35] == '-' && traceparent[52] == '-' {
		id := traceparent[36:52]
		if isLowerHex(id) && isLowerHex(traceparent[3:35]) && string(id) != "0000000000000000" {
			return string(id)
		}
	}
	return ""
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

func putUint64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (56 - 8*i))
	}
}
