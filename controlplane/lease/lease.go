// Package lease is the pull API for online trainers: a queue of samples that
// a trainer leases in batches of N, then acknowledges. A lease not
// acknowledged before its deadline returns its samples to the front of the
// queue (in their order), so no sample is lost; an acknowledged sample is
// gone for good, so none is handed out again after an ack. Expiry is checked
// on every call against an injectable clock.
package lease

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	httproute "github.com/rollgate/rollgate/internal/route"
)

// ErrUnknownLease is returned by Ack for a lease that does not exist, was
// already acknowledged, or expired (its samples are back in the queue). The
// pull API answers it with 404, saying nothing of which leases exist.
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
	newID  func() string // lease ids: newLeaseID, or a test's
	seq    uint64
	acked  int
}

// New returns a queue whose leases last ttl; now is the clock (nil = time.Now).
func New(ttl time.Duration, now func() time.Time) *Queue {
	if now == nil {
		now = time.Now
	}
	return &Queue{ttl: ttl, now: now, leases: map[string]*lease{}, newID: newLeaseID}
}

// newLeaseID returns an unguessable lease id: "lease-" and 128 bits from
// crypto/rand in hex. A lease id is what acknowledges (consumes) samples, so
// one trainer cannot guess another's.
func newLeaseID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return "lease-" + hex.EncodeToString(b[:])
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
	id = q.newID()
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

// maxBody bounds a request body of the pull API.
const maxBody = 1 << 16

// answer is one response of the pull API: a status and a JSON value (nil:
// no body).
type answer struct {
	status int
	v      any
}

// A route of the pull API: the method and path below its mount point, and
// what answers it given the request body.
type route struct {
	method, path string
	answer       func(q *Queue, body io.Reader) answer
}

// routes are the pull API (see Serve).
var routes = []route{
	{"POST", "/lease", (*Queue).leaseAnswer},
	{"POST", "/ack", (*Queue).ackAnswer},
	{"GET", "/counts", func(q *Queue, _ io.Reader) answer { return answer{http.StatusOK, q.Counts()} }},
}

// Routes lists the pull API's routes, paths below its mount point
// (docs/docs_test.go reads them, through controlplane.Routes).
func Routes() []httproute.Info {
	out := make([]httproute.Info, 0, len(routes))
	for _, r := range routes {
		out = append(out, httproute.Info{Method: r.method, Pattern: r.path, Auth: httproute.Admin})
	}
	return out
}

func (q *Queue) leaseAnswer(body io.Reader) answer {
	var in struct {
		N int `json:"n"`
	}
	if err := strictDecode(body, &in); err != nil || in.N <= 0 {
		return errorAnswer(http.StatusBadRequest, `body must be {"n": N} with N >= 1`+strictDetail(err))
	}
	id, samples, exp := q.Lease(in.N)
	if id == "" {
		return answer{status: http.StatusNoContent}
	}
	return answer{http.StatusOK, map[string]any{"lease_id": id, "expires_unix_nano": exp.UnixNano(), "samples": samples}}
}

func (q *Queue) ackAnswer(body io.Reader) answer {
	var in struct {
		LeaseID string `json:"lease_id"`
	}
	if err := strictDecode(body, &in); err != nil || in.LeaseID == "" {
		return errorAnswer(http.StatusBadRequest, `body must be {"lease_id": "..."}`+strictDetail(err))
	}
	if err := q.Ack(in.LeaseID); err != nil {
		return errorAnswer(http.StatusNotFound, err.Error())
	}
	return answer{http.StatusOK, map[string]bool{"acked": true}}
}

// strictDecode decodes one JSON value from body into v as every /api/v1
// body is decoded (docs/contract.md §2): an unknown field is an error
// naming it, and so is anything after the value.
func strictDecode(body io.Reader, v any) error {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errTrailing
	}
	return nil
}

// errTrailing is a body with more after its JSON value.
var errTrailing = errors.New("trailing data after the JSON value")

// strictDetail names what strictDecode refused beyond a malformed body (an
// unknown field, trailing data), to be appended to the usage message.
func strictDetail(err error) string {
	if err != nil && (errors.Is(err, errTrailing) || strings.HasPrefix(err.Error(), "json: unknown field")) {
		return ": " + strings.TrimPrefix(err.Error(), "json: ")
	}
	return ""
}

func errorAnswer(status int, msg string) answer {
	return answer{status, map[string]any{"error": map[string]string{"message": msg, "type": "invalid_request_error"}}}
}

// body is the answer's JSON and a newline (nil when there is none, or when
// its value cannot be encoded: a sample added that is not JSON, logged).
func (a answer) body() []byte {
	if a.v == nil {
		return nil
	}
	b, err := json.Marshal(a.v)
	if err != nil {
		slog.Warn("lease: writing response", "err", err)
		return nil
	}
	return append(b, '\n')
}

// Serve answers a request of the pull API on fasthttp, sub being its path
// below the API's mount point (the control plane mounts it on
// /api/v1/bridge):
//
//	POST /lease {"n": N}        -> 200 {"lease_id", "expires_unix_nano", "samples": [...]}, or 204 when empty
//	POST /ack {"lease_id": id}  -> 200 {"acked": true}, or 404 when the lease is unknown, acknowledged or expired
//	GET  /counts                -> {"pending", "leased", "acked"}
//
// Other paths get 404 and other methods 405 with Allow, as from Handler.
func (q *Queue) Serve(ctx *fasthttp.RequestCtx, sub string) {
	method := string(ctx.Method())
	var allow []string
	for _, r := range routes {
		if r.path != sub {
			continue
		}
		if r.method != method && !(r.method == "GET" && method == "HEAD") {
			allow = append(allow, r.method)
			if r.method == "GET" {
				allow = append(allow, "HEAD")
			}
			continue
		}
		body := ctx.Request.Body()
		a := r.answer(q, io.LimitReader(bytes.NewReader(body), maxBody))
		ctx.SetStatusCode(a.status)
		if a.v != nil {
			ctx.SetContentType("application/json")
			ctx.SetBody(a.body())
		}
		return
	}
	// What net/http's ServeMux answers (Handler, and this API before it
	// moved onto fasthttp).
	ctx.Response.Header.Set("Content-Type", "text/plain; charset=utf-8")
	ctx.Response.Header.Set("X-Content-Type-Options", "nosniff")
	if len(allow) == 0 {
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetBodyString("404 page not found\n")
		return
	}
	slices.Sort(allow)
	ctx.Response.Header.Set("Allow", strings.Join(allow, ", "))
	ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
	ctx.SetBodyString("Method Not Allowed\n")
}

// Handler serves the queue over net/http, its routes at the root (see
// Serve): rollgate bridge --serve runs it on its own.
func (q *Queue) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, r := range routes {
		mux.HandleFunc(r.method+" "+r.path, func(w http.ResponseWriter, req *http.Request) {
			a := r.answer(q, http.MaxBytesReader(w, req.Body, maxBody))
			if a.v != nil {
				w.Header().Set("Content-Type", "application/json")
			}
			w.WriteHeader(a.status)
			if b := a.body(); b != nil {
				_, _ = w.Write(b)
			}
		})
	}
	return mux
}
