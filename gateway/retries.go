package gateway

import (
	"hash/maphash"
	"sync"

	"github.com/valyala/fasthttp"
)

// Client retries. The OpenAI and Anthropic SDKs (Python and JavaScript)
// retry a call that timed out or got a 408, 409, 429 or 5xx with the same
// body and an x-stainless-retry-count header: "0" on the first try, n on the
// n-th retry. Neither sets an Idempotency-Key by default (their clients'
// idempotency header is unset), but other clients send one and keep it
// across tries. A retry is one call: it takes the sequence id of the try it
// repeats, and its rows say which try they are (retry_count, retry_of).
//
// A call is taken for a retry of an earlier call of the same (rollout,
// attempt) when it carries the Idempotency-Key of that call, or an
// x-stainless-retry-count above 0 and that call's body (byte for byte, the
// SDKs serialise the same options the same way on every try). Anything else
// is a new call: a call with an earlier call's body but no retry signal
// (agents do repeat themselves), a retry header whose call is not
// remembered (another body, another attempt, forgotten: counted
// "unmatched" in rollgate_retries_total, never refused). Calls attributed
// to no rollout are never matched: their attempt is everybody's.
//
// What is remembered: the last retryRecent calls of each attempt, in the
// attempt's entry of the sequence table (retryMemo, counted in the table's
// byte bound as seqRetryOverhead), as 64-bit hashes of the body and key, so
// memory does not grow with bodies. An entry evicted from the table forgets
// them with it.

// retryRecent is how many recent calls of an attempt can be retried: an
// SDK retries the call it just made, so a few cover calls an agent makes
// concurrently in one attempt (parallel tool calls).
const retryRecent = 4

// retrySeed keys the body and key hashes (random per process).
var retrySeed = maphash.MakeSeed()

// retryTry is one remembered call of an attempt.
type retryTry struct {
	body uint64 // hash of the request body
	key  uint64 // hash of the Idempotency-Key, 0 without one
	seq  uint64 // the call's sequence id (0 with no ticket: an empty slot)
	// ticket is the reservation of the call's id while it was under way
	// when the call was remembered (seq 0): a retry arriving before the
	// first try has its id (an SDK timing out on a slow engine) waits on
	// the same ticket and takes the same id.
	ticket *seqTicket
	first  [16]byte // span id of the call's first try
	tries  uint16   // retries seen so far (the last retry_count given)
}

// retryMemo is an attempt's recent calls, a ring of retryRecent.
type retryMemo struct {
	mu     sync.Mutex
	recent [retryRecent]retryTry
	next   uint8
}

// retrySignal is what a request says about being a retry.
type retrySignal struct {
	count   uint64 // x-stainless-retry-count (0: absent, "0" or not a number)
	key     uint64 // hash of Idempotency-Key (0: absent)
	present bool   // either header is there (an SDK's first try sends "0")
}

// readRetrySignal reads the retry headers of a request.
func readRetrySignal(h *fasthttp.RequestHeader) retrySignal {
	var sig retrySignal
	if v := h.Peek("x-stainless-retry-count"); len(v) > 0 {
		sig.present = true
		if n, err := fasthttp.ParseUint(v); err == nil { // not a number: no signal
			sig.count = uint64(n)
		}
	}
	if v := h.Peek("Idempotency-Key"); len(v) > 0 {
		sig.key = maphash.Bytes(retrySeed, v) | 1 // never 0: 0 is "none"
		sig.present = true
	}
	return sig
}

// match finds the remembered call this one retries: by key when it has one,
// else (with a retry count above 0) by body, the latest first. A match
// counts one more try; it returns the try as it now stands.
func (m *retryMemo) match(body uint64, sig retrySignal) (retryTry, bool) {
	if sig.key == 0 && sig.count == 0 {
		return retryTry{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range retryRecent {
		t := &m.recent[(int(m.next)+retryRecent-1-i)%retryRecent]
		if t.seq == 0 && t.ticket == nil {
			break
		}
		if sig.key != 0 && t.key == sig.key || sig.key == 0 && t.key == 0 && t.body == body {
			if t.tries < ^uint16(0) {
				t.tries++
			}
			return *t, true
		}
	}
	return retryTry{}, false
}

// remember records a new call of the attempt, replacing the oldest.
func (m *retryMemo) remember(body, key, seq uint64, span [16]byte) {
	m.put(retryTry{body: body, key: key, seq: seq, first: span})
}

// rememberPending records a new call whose id is still being reserved
// (ticket t): its retries take the id t gives.
func (m *retryMemo) rememberPending(body, key uint64, span [16]byte, t *seqTicket) {
	m.put(retryTry{body: body, key: key, ticket: t, first: span})
}

func (m *retryMemo) put(t retryTry) {
	m.mu.Lock()
	m.recent[m.next] = t
	m.next = (m.next + 1) % retryRecent
	m.mu.Unlock()
}

// assignSequence is admitAhead's sequence id: the id of the call a retry
// repeats (with its try number and first span on the row), else a new id
// from the sequence table, remembered for the call's own retries; or, when
// the attempt needs a new block, the reservation's ticket (remembered too:
// a retry of a call whose id is still being reserved waits on the same
// ticket).
func (s *Server) assignSequence(ctx *fasthttp.RequestCtx, c *call) (*seqEntry, uint64, *seqTicket) {
	attr, p := c.attr, c.pend
	if len(attr.rolloutID) == 0 {
		return s.seq.take(attr.rolloutID, attr.attemptID)
	}
	sig := readRetrySignal(&ctx.Request.Header)
	if !sig.present {
		// No SDK retry header and no key: this call cannot be a retry, and
		// a retry of it (which would carry one) cannot be told from a new
		// call, so its body is neither hashed nor remembered.
		return s.seq.take(attr.rolloutID, attr.attemptID)
	}
	body := maphash.String(retrySeed, p.Request)
	if sig.key != 0 || sig.count > 0 {
		if e := s.seq.lookup(attr.rolloutID, attr.attemptID); e != nil {
			if t, ok := e.retries.match(body, sig); ok {
				s.m.Retries.WithLabelValues("matched").Inc()
				p.Meta.RetryCount = t.tries
				p.Meta.RetryOf = string(t.first[:])
				if t.seq == 0 { // the first try's id is still being reserved
					return e, 0, t.ticket
				}
				return e, t.seq, nil
			}
		}
		if sig.count > 0 {
			s.m.Retries.WithLabelValues("unmatched").Inc()
		}
	}
	e, seq, t := s.seq.take(attr.rolloutID, attr.attemptID)
	if t != nil {
		e.retries.rememberPending(body, sig.key, p.IDs.Span, t)
		return e, 0, t
	}
	e.retries.remember(body, sig.key, seq, p.IDs.Span)
	return e, seq, nil
}

// lookup returns the entry of (rollout, attempt), nil when the table has
// none; it takes no id.
func (s *sequences) lookup(rollout, attempt []byte) *seqEntry {
	var kb [seqKeyBuf]byte
	key := append(append(append(kb[:0], rollout...), 0), attempt...)
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m[string(key)]
}
