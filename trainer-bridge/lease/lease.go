// Package lease is the pull API for online trainers: a queue of samples that
// a trainer leases in batches of N, then acknowledges. A lease not
// acknowledged before its deadline returns its samples to the front of the
// queue (in their order), so no sample is lost; an acknowledged sample is
// gone for good, so none is handed out again after an ack. Expiry is checked
// on every call against an injectable clock.
package lease

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// ErrUnknownLease is returned by Ack for a lease that does not exist, was
// already acknowledged, or expired (its samples are back in the queue).
var ErrUnknownLease = errors.New("lease: unknown, already acknowledged or expired lease")

type lease struct {
	items   []item
	expires time.Time
}

type item struct {
	seq  uint64 // insertion order, to put expired items back in place
	data json.RawMessage
}

// Queue holds samples (as JSON) for leasing. It is safe for concurrent use.
type Queue struct {
	mu     sync.Mutex
	ttl    time.Duration
	now    func() time.Time
	queue  []item
	leases map[string]*lease
	nextID uint64
	seq    uint64
	acked  int
}

// New returns a queue whose leases last ttl; now is the clock (nil = time.Now).
func New(ttl time.Duration, now func() time.Time) *Queue {
	if now == nil {
		now = time.Now
	}
	return &Queue{ttl: ttl, now: now, leases: map[string]*lease{}}
}

// Add appends samples to the queue.
func (q *Queue) Add(samples ...json.RawMessage) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, s := range samples {
		q.seq++
		q.queue = append(q.queue, item{seq: q.seq, data: s})
	}
}

// expire returns the items of expired leases to the queue, keeping the
// queue in insertion order.
func (q *Queue) expire(now time.Time) {
	var back []item
	for id, l := range q.leases {
		if !now.Before(l.expires) {
			back = append(back, l.items...)
			delete(q.leases, id)
		}
	}
	if len(back) == 0 {
		return
	}
	merged := make([]item, 0, len(back)+len(q.queue))
	merged = append(merged, back...)
	merged = append(merged, q.queue...)
	// insertion sort is enough: both parts are sorted runs of few items.
	for i := 1; i < len(merged); i++ {
		for j := i; j > 0 && merged[j-1].seq > merged[j].seq; j-- {
			merged[j-1], merged[j] = merged[j], merged[j-1]
		}
	}
	q.queue = merged
}

// Lease hands out up to n samples under a new lease id, or ("", nil) when
// the queue is empty.
func (q *Queue) Lease(n int) (id string, samples []json.RawMessage, expires time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	q.expire(now)
	if n <= 0 || len(q.queue) == 0 {
		return "", nil, time.Time{}
	}
	n = min(n, len(q.queue))
	l := &lease{items: append([]item(nil), q.queue[:n]...), expires: now.Add(q.ttl)}
	q.queue = q.queue[n:]
	q.nextID++
	id = "lease-" + strconv.FormatUint(q.nextID, 10)
	q.leases[id] = l
	samples = make([]json.RawMessage, n)
	for i, it := range l.items {
		samples[i] = it.data
	}
	return id, samples, l.expires
}

// Ack acknowledges a lease: its samples are consumed.
func (q *Queue) Ack(id string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expire(q.now())
	l, ok := q.leases[id]
	if !ok {
		return ErrUnknownLease
	}
	delete(q.leases, id)
	q.acked += len(l.items)
	return nil
}

// Counts are the queue's sizes.
type Counts struct {
	Pending int `json:"pending"` // waiting to be leased
	Leased  int `json:"leased"`  // in unexpired, unacknowledged leases
	Acked   int `json:"acked"`   // consumed
}

// Counts returns the current sizes.
func (q *Queue) Counts() Counts {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expire(q.now())
	c := Counts{Pending: len(q.queue), Acked: q.acked}
	for _, l := range q.leases {
		c.Leased += len(l.items)
	}
	return c
}

// Handler serves the queue over HTTP:
//
//	POST /lease {"n": N}        -> 200 {"lease_id", "expires_unix_nano", "samples": [...]}, or 204 when empty
//	POST /ack {"lease_id": id}  -> 200 {"acked": true}, or 409 when the lease is unknown or expired
//	GET  /counts                -> {"pending", "leased", "acked"}
func (q *Queue) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /lease", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			N int `json:"n"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&in); err != nil || in.N <= 0 {
			httpError(w, http.StatusBadRequest, `body must be {"n": N} with N >= 1`)
			return
		}
		id, samples, exp := q.Lease(in.N)
		if id == "" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"lease_id": id, "expires_unix_nano": exp.UnixNano(), "samples": samples})
	})
	mux.HandleFunc("POST /ack", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			LeaseID string `json:"lease_id"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&in); err != nil || in.LeaseID == "" {
			httpError(w, http.StatusBadRequest, `body must be {"lease_id": "..."}`)
			return
		}
		if err := q.Ack(in.LeaseID); err != nil {
			httpError(w, http.StatusConflict, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string]bool{"acked": true})
	})
	mux.HandleFunc("GET /counts", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, q.Counts())
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		slog.Warn("lease: writing response", "err", err)
	}
}

func httpError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"message": msg, "type": "invalid_request_error"}})
}
