package lease

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func raws(xs ...string) []json.RawMessage {
	out := make([]json.RawMessage, len(xs))
	for i, x := range xs {
		out[i] = json.RawMessage(x)
	}
	return out
}

func str(rs []json.RawMessage) string {
	var parts []string
	for _, r := range rs {
		parts = append(parts, string(r))
	}
	return strings.Join(parts, ",")
}

func TestLeaseAckExpire(t *testing.T) {
	c := &clock{t: time.Unix(100, 0)}
	q := New(10*time.Second, c.now)
	q.Add(raws("1", "2", "3", "4", "5")...)
	id1, s1, exp := q.Lease(2)
	if str(s1) != "1,2" || !exp.Equal(time.Unix(110, 0)) {
		t.Fatalf("lease 1: %s %v", str(s1), exp)
	}
	id2, s2, _ := q.Lease(2)
	if str(s2) != "3,4" {
		t.Fatalf("lease 2: %s", str(s2))
	}
	if err := q.Ack(id2); err != nil {
		t.Fatal(err)
	}
	if err := q.Ack(id2); err != ErrUnknownLease {
		t.Fatalf("second ack: %v", err)
	}
	// Lease 1 expires: 1 and 2 go back in front of 5, in order.
	c.t = time.Unix(110, 0)
	if got := q.Counts(); got != (Counts{Pending: 3, Leased: 0, Acked: 2}) {
		t.Fatalf("counts %+v", got)
	}
	if err := q.Ack(id1); err != ErrUnknownLease {
		t.Fatalf("ack of an expired lease: %v", err)
	}
	id3, s3, _ := q.Lease(10)
	if str(s3) != "1,2,5" || id3 == id1 {
		t.Fatalf("lease 3: %s %s", id3, str(s3))
	}
	if err := q.Ack(id3); err != nil {
		t.Fatal(err)
	}
	if id, s, _ := q.Lease(1); id != "" || s != nil {
		t.Fatalf("empty queue leased %s %v", id, s)
	}
	if got := q.Counts(); got != (Counts{Acked: 5}) {
		t.Fatalf("final counts %+v", got)
	}
}

// TestConcurrentConsumers: trainers lease, some let their leases expire
// (the clock advances), the rest ack; in the end every sample is acked
// exactly once.
func TestConcurrentConsumers(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(0, 0)
	q := New(time.Second, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	const total = 2000
	for i := range total {
		q.Add(json.RawMessage(fmt.Sprint(i)))
	}
	seen := make([]int, total)
	var seenMu sync.Mutex
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				id, s, _ := q.Lease(7)
				if id == "" {
					if c := q.Counts(); c.Pending == 0 && c.Leased == 0 {
						return
					}
					mu.Lock()
					now = now.Add(time.Second) // let abandoned leases expire
					mu.Unlock()
					continue
				}
				if (k+w)%5 == 0 {
					continue // abandon this lease
				}
				if q.Ack(id) != nil {
					continue // expired meanwhile: its samples are back in the queue
				}
				seenMu.Lock()
				for _, r := range s {
					var i int
					json.Unmarshal(r, &i)
					seen[i]++
				}
				seenMu.Unlock()
			}
		}()
	}
	wg.Wait()
	for i, n := range seen {
		if n != 1 {
			t.Fatalf("sample %d acked %d times", i, n)
		}
	}
}

func TestHTTP(t *testing.T) {
	c := &clock{t: time.Unix(0, 0)}
	q := New(time.Minute, c.now)
	q.Add(raws(`{"a":1}`, `{"a":2}`, `{"a":3}`)...)
	srv := httptest.NewServer(q.Handler())
	defer srv.Close()
	post := poster(t, srv.URL)
	code, body := post("/lease", `{"n":2}`)
	var l struct {
		LeaseID string            `json:"lease_id"`
		Expires int64             `json:"expires_unix_nano"`
		Samples []json.RawMessage `json:"samples"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &l) != nil || str(l.Samples) != `{"a":1},{"a":2}` || l.Expires != int64(time.Minute) {
		t.Fatalf("lease: %d %s", code, body)
	}
	if code, body = post("/ack", `{"lease_id":"`+l.LeaseID+`"}`); code != 200 {
		t.Fatalf("ack: %d %s", code, body)
	}
	if code, body = post("/ack", `{"lease_id":"`+l.LeaseID+`"}`); code != 404 || !strings.Contains(body, "already acknowledged") {
		t.Fatalf("second ack: %d %s", code, body)
	}
	if code, _ = post("/lease", `{"n":0}`); code != 400 {
		t.Fatalf("n=0: %d", code)
	}
	if code, _ = post("/lease", `{"n":5}`); code != 200 {
		t.Fatalf("last lease: %d", code)
	}
	if code, _ = post("/lease", `{"n":5}`); code != 204 {
		t.Fatalf("empty: %d", code)
	}
	r, err := http.Get(srv.URL + "/counts")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if strings.TrimSpace(string(b)) != `{"pending":0,"leased":1,"acked":2}` {
		t.Fatalf("counts %s", b)
	}
}

func BenchmarkLeaseAck(b *testing.B) {
	q := New(time.Minute, nil)
	s := json.RawMessage(`{"prompt_ids":[1,2,3]}`)
	b.ReportAllocs()
	for b.Loop() {
		q.Add(s, s, s, s)
		id, _, _ := q.Lease(4)
		if q.Ack(id) != nil {
			b.Fatal("ack")
		}
	}
}

// TestServeMatchesHandler: the pull API on fasthttp (Serve, as the control
// plane mounts it on /api/v1/bridge) and Handler answer every request as the
// net/http handler did when the control plane mounted it through
// fasthttpadaptor (referenceHandler): same status, headers that matter and
// body, for good, bad, oversized and misrouted requests alike. All run on
// real fasthttp servers on loopback, with queues in the same state.
func TestServeMatchesHandler(t *testing.T) {
	const prefix = "/api/v1/bridge"
	start := func(h fasthttp.RequestHandler) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &fasthttp.Server{Handler: h}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Shutdown() })
		return "http://" + ln.Addr().String()
	}
	queue := func() *Queue {
		c := &clock{t: time.Unix(7, 0)}
		q := New(time.Minute, c.now)
		n := 0
		q.newID = func() string { n++; return fmt.Sprint("lease-", n) } // the same ids in the three queues
		q.Add(raws(`{"a":1}`, `{"a":2}`, `{"a":3}`, `{"a":"<&>"}`)...)
		return q
	}
	refQ, newQ, handlerQ := queue(), queue(), queue()
	refURL := start(fasthttpadaptor.NewFastHTTPHandler(http.StripPrefix(prefix, referenceHandler(refQ))))
	newURL := start(func(ctx *fasthttp.RequestCtx) {
		newQ.Serve(ctx, strings.TrimPrefix(string(ctx.Path()), prefix))
	})
	handlerURL := start(fasthttpadaptor.NewFastHTTPHandler(http.StripPrefix(prefix, handlerQ.Handler())))
	do := func(base, method, path, body string) string {
		req, err := http.NewRequest(method, base+prefix+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return fmt.Sprintf("%d type=%q allow=%q nosniff=%q body=%q", r.StatusCode, r.Header.Get("Content-Type"),
			r.Header.Get("Allow"), r.Header.Get("X-Content-Type-Options"), b)
	}
	big := `{"n":1,"pad":"` + strings.Repeat("x", 1<<16) + `"}`
	for _, c := range []struct{ method, path, body, want string }{
		{"POST", "/lease", `{"n":2}`, "200 "},
		{"POST", "/ack", `{"lease_id":"lease-1"}`, "200 "},
		{"POST", "/ack", `{"lease_id":"lease-1"}`, "404 "},
		{"POST", "/ack", `{}`, "400 "},
		{"POST", "/ack", `[`, "400 "},
		{"POST", "/lease", `{"n":0}`, "400 "},
		{"POST", "/lease", `{"n":"2"}`, "400 "},
		{"POST", "/lease", ``, "400 "},
		{"POST", "/lease", big, "400 "},
		{"POST", "/lease", `{"n":1} trailing`, "400 "}, // 200 before the bodies were strict (contract §2)
		{"POST", "/lease", `{"n":1,"m":2}`, "400 "},
		{"POST", "/ack", `{"lease_id":"x","id":"y"}`, "400 "},
		{"GET", "/counts", ``, "200 "},
		{"HEAD", "/counts", ``, "200 "},
		{"GET", "/lease", ``, "405 "},
		{"PUT", "/ack", `{}`, "405 "},
		{"POST", "/counts", ``, "405 "},
		{"DELETE", "/counts", ``, "405 "},
		{"GET", "/nope", ``, "404 "},
		{"POST", "/lease/", `{"n":1}`, "404 "},
		{"GET", "/", ``, "404 "},
		{"POST", "/lease", `{"n":5}`, "200 "},
		{"POST", "/lease", `{"n":5}`, "204 "},
		{"GET", "/counts", ``, "200 "},
	} {
		ref, got, h := do(refURL, c.method, c.path, c.body), do(newURL, c.method, c.path, c.body), do(handlerURL, c.method, c.path, c.body)
		if got != ref || h != ref {
			t.Errorf("%s %s %.40q:\n Serve     %s\n Handler   %s\n reference %s", c.method, c.path, c.body, got, h, ref)
		}
		if !strings.HasPrefix(got, c.want) {
			t.Errorf("%s %s %.40q: %s, want status %s", c.method, c.path, c.body, got, c.want)
		}
	}
}

// referenceHandler is Handler as it was when the control plane mounted it
// through fasthttpadaptor (before Serve), kept as the reference of
// TestServeMatchesHandler:
//
//	POST /lease {"n": N}        -> 200 {"lease_id", "expires_unix_nano", "samples": [...]}, or 204 when empty
//	POST /ack {"lease_id": id}  -> 200 {"acked": true}, or 404 when the lease is unknown or expired
//	GET  /counts                -> {"pending", "leased", "acked"}
//
// (409 for an unknown lease until issue 36 made it 404; bodies decoded
// strictly, as docs/contract.md §2 says of every /api/v1 body, since
// issue 34: refStrict.)
func referenceHandler(q *Queue) http.Handler {
	// refStrict and refDetail: encoding/json with unknown fields and
	// trailing data refused, named after the usage message.
	refStrict := func(r io.Reader, v any) error {
		dec := json.NewDecoder(r)
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			return err
		}
		if dec.More() {
			return errors.New("trailing data after the JSON value")
		}
		return nil
	}
	refDetail := func(err error) string {
		if err == nil {
			return ""
		}
		if m := err.Error(); strings.HasPrefix(m, "json: unknown field") || strings.HasPrefix(m, "trailing data") {
			return ": " + strings.TrimPrefix(m, "json: ")
		}
		return ""
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /lease", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			N int `json:"n"`
		}
		if err := refStrict(http.MaxBytesReader(w, r.Body, 1<<16), &in); err != nil || in.N <= 0 {
			refHTTPError(w, http.StatusBadRequest, `body must be {"n": N} with N >= 1`+refDetail(err))
			return
		}
		id, samples, exp := q.Lease(in.N)
		if id == "" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		refWriteJSON(w, http.StatusOK, map[string]any{"lease_id": id, "expires_unix_nano": exp.UnixNano(), "samples": samples})
	})
	mux.HandleFunc("POST /ack", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			LeaseID string `json:"lease_id"`
		}
		if err := refStrict(http.MaxBytesReader(w, r.Body, 1<<16), &in); err != nil || in.LeaseID == "" {
			refHTTPError(w, http.StatusBadRequest, `body must be {"lease_id": "..."}`+refDetail(err))
			return
		}
		if err := q.Ack(in.LeaseID); err != nil {
			refHTTPError(w, http.StatusNotFound, err.Error())
			return
		}
		refWriteJSON(w, http.StatusOK, map[string]bool{"acked": true})
	})
	mux.HandleFunc("GET /counts", func(w http.ResponseWriter, r *http.Request) {
		refWriteJSON(w, http.StatusOK, q.Counts())
	})
	return mux
}

func refWriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		panic(err)
	}
}

func refHTTPError(w http.ResponseWriter, status int, msg string) {
	refWriteJSON(w, status, map[string]any{"error": map[string]string{"message": msg, "type": "invalid_request_error"}})
}

// TestLeaseIDsUnguessable: lease ids carry 128 random bits (they were
// lease-1, lease-2, ...: anyone could ack another trainer's lease); an ack
// of an id that was never handed out is 404 and names no lease.
func TestLeaseIDsUnguessable(t *testing.T) {
	q := New(time.Minute, nil)
	seen := map[string]bool{}
	for range 1000 {
		q.Add(json.RawMessage(`1`))
		id, _, _ := q.Lease(1)
		hexPart, ok := strings.CutPrefix(id, "lease-")
		if _, err := hex.DecodeString(hexPart); !ok || err != nil || len(hexPart) != 32 {
			t.Fatalf("lease id %q is not lease- and 128 bits in hex", id)
		}
		if seen[id] {
			t.Fatalf("lease id %q handed out twice", id)
		}
		seen[id] = true
	}
	srv := httptest.NewServer(q.Handler())
	defer srv.Close()
	for _, guess := range []string{"lease-1", "lease-0", "lease-00000000000000000000000000000000"} {
		r, err := http.Post(srv.URL+"/ack", "application/json", strings.NewReader(`{"lease_id":"`+guess+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != 404 {
			t.Errorf("ack of %s: %d %s", guess, r.StatusCode, b)
		}
		for id := range seen {
			if strings.Contains(string(b), id) {
				t.Fatalf("the 404 names the live lease %s: %s", id, b)
			}
		}
	}
	if c := q.Counts(); c.Leased != 1000 || c.Acked != 0 {
		t.Fatalf("guessed acks consumed samples: %+v", c)
	}
}

// TestBodiesStrict: the lease and ack bodies are decoded as every /api/v1
// body is (docs/contract.md §2): an unknown field is a 400 naming it, and
// so is a second JSON value; nothing is leased or acknowledged.
func TestBodiesStrict(t *testing.T) {
	q := New(time.Minute, nil)
	q.Add(raws(`{"a":1}`)...)
	srv := httptest.NewServer(q.Handler())
	defer srv.Close()
	post := poster(t, srv.URL)
	for _, c := range []struct{ path, body, want string }{
		{"/lease", `{"n":1,"count":5}`, `unknown field \"count\"`},
		{"/lease", `{"n":1} {"n":2}`, "trailing data"},
		{"/ack", `{"lease_id":"x","leaseid":"y"}`, `unknown field \"leaseid\"`},
		{"/ack", `{"lease_id":"x"} []`, "trailing data"},
	} {
		if code, body := post(c.path, c.body); code != 400 || !strings.Contains(body, c.want) {
			t.Errorf("POST %s %s: %d %s, want 400 naming %s", c.path, c.body, code, body, c.want)
		}
	}
	if c := q.Counts(); c != (Counts{Pending: 1}) {
		t.Errorf("counts after refused bodies: %+v, want 1 pending", c)
	}
}

// poster returns a function that POSTs a JSON body to base+path and
// returns the status and body of the answer.
func poster(t *testing.T, base string) func(path, body string) (int, string) {
	return func(path, body string) (int, string) {
		r, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, string(b)
	}
}
