package main

// Read routes against the real gateway process (issue 36 items 6 and 13):
// the viewer and /api/v1 read one call to show one and page a rollout's
// calls, their memory does not grow with the rollout; viewer paths are
// unescaped once, /ui/ is the viewer, time filters are range-checked and
// the live list's refresh is cheap while nothing changes.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
)

// fillRollout writes a rollout of n calls (attempt a1), each with a request
// and a response body of size bytes, into the embedded store at db.
func fillRollout(t testing.TB, db, rollout string, n, size int, extra *export.Batch) {
	t.Helper()
	s, err := sqlite.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pad := strings.Repeat("x", size)
	const t0 = uint64(1_800_000_000_000_000_000)
	b := &export.Batch{}
	for i := range n {
		at := t0 + uint64(i)*1_000_000
		b.Calls = append(b.Calls, export.Call{SpanID: fmt.Sprintf("%s-%d", rollout, i), RolloutID: rollout, AttemptID: "a1", SequenceID: uint64(i + 1),
			StartTimeUnixNano: at, EndTimeUnixNano: at + 500_000, HTTPStatus: 200, Endpoint: "/v1/chat/completions", Model: "m",
			RequestBody:     `{"model":"m","messages":[{"role":"user","content":"call ` + strconv.Itoa(i+1) + ` ` + pad + `"}]}`,
			ResponseBody:    `{"choices":[{"message":{"role":"assistant","content":"` + pad + `"}}]}`,
			ResponseMessage: `{"role":"assistant","content":"answer ` + strconv.Itoa(i+1) + `"}`,
			PromptTokenIDs:  []uint32{1, 2, 3}, ResponseTokenIDs: []uint32{4}, TokenSource: export.TokenSourceEngine})
		if len(b.Calls) == 100 {
			if err := s.Write(context.Background(), b); err != nil {
				t.Fatal(err)
			}
			b = &export.Batch{}
		}
	}
	if extra != nil {
		b.Calls, b.Rollouts, b.Rewards = append(b.Calls, extra.Calls...), append(b.Rollouts, extra.Rollouts...), append(b.Rewards, extra.Rewards...)
	}
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
}

// peakRSS is the process's peak resident set (VmHWM), in bytes.
func peakRSS(t testing.TB, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb * 1024
		}
	}
	t.Fatal("no VmHWM in /proc/pid/status")
	return 0
}

// getAll GETs each url from its own goroutine, conc at a time per url, and
// fails unless every answer is want; it returns the first body of each.
func getAll(t testing.TB, urls []string, conc, want int) []string {
	t.Helper()
	bodies := make([]string, len(urls))
	var wg sync.WaitGroup
	errs := make(chan error, len(urls)*conc)
	for i, u := range urls {
		for k := range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := http.Get(u)
				if err != nil {
					errs <- err
					return
				}
				b, err := io.ReadAll(r.Body)
				r.Body.Close()
				if err != nil || r.StatusCode != want {
					errs <- fmt.Errorf("GET %s: %d, want %d: %v %.300s", u, r.StatusCode, want, err, b)
					return
				}
				if k == 0 {
					bodies[i] = string(b)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return bodies
}

// TestReadsOfOneCallAreBounded: 16 concurrent raw-body reads, then 16
// tokens pages, then 16 GET /api/v1/rollouts/{id} of a rollout of 300 calls × 2 bodies of
// 200 KB (120 MB) keep the gateway's peak RSS within 64 MiB of what it was;
// the rollout page pages its calls (and says so) with a link that goes on.
func TestReadsOfOneCallAreBounded(t *testing.T) {
	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "r.db")
	fillRollout(t, db, "ro-big", 300, 200_000, nil)
	cmd := exec.Command(binary, "serve", "--listen", addr, "--db", db)
	logs := startCmd(t, cmd, addr)
	base := "http://" + addr
	getAll(t, []string{base + "/ui/rollouts/ro-big/calls/7/raw"}, 1, 200) // warm up: pools, the store's cache
	before := peakRSS(t, cmd.Process.Pid)
	// The bounds: 64 MiB for the pages of one call. GET /api/v1/rollouts/{id}
	// reads 300 rows without their bodies, but SQLite walks each row's
	// overflow pages (the bodies) to reach the columns stored after them:
	// 256 MiB (main read the 120 MB of bodies per request: about 2 GB).
	for _, c := range []struct {
		u     string
		bound float64
	}{{"/ui/rollouts/ro-big/calls/150/raw?attempt=a1", 64 << 20}, {"/ui/rollouts/ro-big/calls/2", 64 << 20}, {"/api/v1/rollouts/ro-big", 256 << 20}} {
		u := c.u
		body := getAll(t, []string{base + u}, 16, 200)[0]
		after := peakRSS(t, cmd.Process.Pid)
		if strings.Contains(u, "raw") && (!strings.Contains(body, "call 150 x") || len(body) < 400_000) {
			t.Errorf("raw page of call 150: %d bytes %.100q", len(body), body)
		}
		if grew := after - before; grew > c.bound {
			t.Errorf("GET %s: peak RSS grew by %.0f MiB (%.0f → %.0f MiB) under 16 concurrent requests, bound %.0f MiB\n%s",
				u, grew/(1<<20), before/(1<<20), after/(1<<20), c.bound/(1<<20), truncateForLog(logs.String()))
		}
		t.Logf("GET %s ×16: peak RSS %.0f → %.0f MiB", u, before/(1<<20), after/(1<<20))
	}

	page := getAll(t, []string{base + "/ui/rollouts/ro-big"}, 1, 200)[0]
	if !strings.Contains(page, "paged, 100 calls a page: this page shows #1 to #100") || !strings.Contains(page, `id="call-100"`) || strings.Contains(page, `id="call-101"`) {
		t.Fatalf("first page does not say it is paged or shows other calls than #1..#100: %.2000s", page)
	}
	if !strings.Contains(page, `id="more-calls" href="/ui/rollouts/ro-big?attempt=a1&amp;after=100"`) {
		t.Fatal("first page: no link to the later calls after #100")
	}
	page = getAll(t, []string{base + "/ui/rollouts/ro-big?attempt=a1&after=100"}, 1, 200)[0]
	if !strings.Contains(page, `id="call-101"`) || strings.Contains(page, `id="call-100"`) || !strings.Contains(page, "after=200") {
		t.Fatalf("second page: not calls #101.. with a link after #200")
	}
	if !strings.Contains(page, "call 101 x") || strings.Contains(page, "call 100 x") {
		t.Error("second page: the conversation of call 101 is not shown as new, or call 100's is repeated")
	}
	if code := getCode(t, base+"/ui/rollouts/ro-big?after=x"); code != 400 {
		t.Errorf("after=x: %d, want 400", code)
	}
}

func getCode(t testing.TB, u string) int {
	t.Helper()
	r, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	return r.StatusCode
}

// TestViewerPathsFiltersAndRefresh: a group id with a percent sign opens
// that group (paths were unescaped twice), /ui/ is the viewer, a far
// future until= names the range, and the list's refresh answers 204 while
// nothing was stored, then the rows once something was.
func TestViewerPathsFiltersAndRefresh(t *testing.T) {
	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "r.db")
	const t0 = uint64(1_800_000_000_000_000_000)
	fillRollout(t, db, "ro-x", 1, 10, &export.Batch{Rollouts: []export.Rollout{
		{RolloutID: "ro-pct", AttemptID: "a1", GroupID: "a%41", Status: "succeeded", Metadata: "{}", CreatedUnixNano: t0, UpdatedUnixNano: t0},
		{RolloutID: "ro-upper", AttemptID: "a1", GroupID: "aA", Status: "succeeded", Metadata: "{}", CreatedUnixNano: t0, UpdatedUnixNano: t0},
	}})
	cmd := exec.Command(binary, "serve", "--listen", addr, "--db", db)
	startCmd(t, cmd, addr)
	base := "http://" + addr
	get := func(u string, want int) (string, http.Header) {
		t.Helper()
		r, err := http.Get(base + u)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		if r.StatusCode != want {
			t.Fatalf("GET %s: %d, want %d: %.300s", u, r.StatusCode, want, b)
		}
		return string(b), r.Header
	}
	page, _ := get("/ui/groups/a%2541", 200)
	if !strings.Contains(page, `data-rollout="ro-pct"`) || strings.Contains(page, `data-rollout="ro-upper"`) {
		t.Errorf("/ui/groups/a%%2541 does not show group a%%41 (ro-pct) alone: %.1500s", page)
	}
	page, h := get("/ui/", 200)
	if !strings.HasPrefix(h.Get("Content-Type"), "text/html") || !strings.Contains(page, `id="rollouts"`) || !strings.Contains(h.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
		t.Errorf("/ui/ is not the viewer's list: %s %.300s", h.Get("Content-Type"), page)
	}
	page, _ = get("/ui/rollouts?until=9999-01-01", 400)
	if !strings.Contains(page, "out of range") || !strings.Contains(page, "2262") {
		t.Errorf("until=9999-01-01: the error does not name the range: %.1500s", page)
	}
	get("/ui/rollouts?since=1969-12-31", 400)

	_, h = get("/ui/rollouts?part=rows", 200)
	v := h.Get("X-Rollgate-Version")
	if v == "" {
		t.Fatal("the list's rows carry no X-Rollgate-Version")
	}
	page, _ = get("/ui", 200)
	if !strings.Contains(page, `data-version="`+v+`"`) {
		t.Errorf("the list page does not carry its version %q", v)
	}
	get("/ui/rollouts?part=rows&v="+v, 204)
	if s, body, _ := post(t, base+"/api/v1/rollouts/ro-x/rewards", `{"value":1}`); s != 200 {
		t.Fatalf("reward: %d %s", s, body)
	}
	if _, h = get("/ui/rollouts?part=rows&v="+v, 200); h.Get("X-Rollgate-Version") == v {
		t.Error("a stored reward did not change the store version")
	}
}

// BenchmarkRawBodyRSS measures the gateway's peak RSS under 16 concurrent
// GET /ui/rollouts/{r}/calls/{n}/raw of a rollout of 2,000 calls of 200 KB
// (two bodies of 100 KB each), reported as peak-MiB (after) and
// grew-MiB (over the warmed-up process). ROLLGATE_BENCH_BINARY runs another
// build (main's, for the figure before).
//
//	go test -run '^$' -bench BenchmarkRawBodyRSS -benchtime 3x ./cmd/rollgate/
func BenchmarkRawBodyRSS(b *testing.B) {
	bin := binary
	if v := os.Getenv("ROLLGATE_BENCH_BINARY"); v != "" {
		bin = v
	}
	addr := freeAddr(b)
	db := filepath.Join(b.TempDir(), "r.db")
	fillRollout(b, db, "ro-big", 2000, 100_000, nil)
	cmd := exec.Command(bin, "serve", "--listen", addr, "--db", db)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	base := "http://" + addr
	waitUntil(b, "the gateway", 20*time.Second, func() bool {
		r, err := http.Get(base + "/readyz")
		if err == nil {
			r.Body.Close()
		}
		return err == nil && r.StatusCode == 200
	})
	getAll(b, []string{base + "/ui/rollouts/ro-big/calls/1/raw"}, 1, 200)
	before := peakRSS(b, cmd.Process.Pid)
	b.ResetTimer()
	for i := range b.N {
		getAll(b, []string{base + "/ui/rollouts/ro-big/calls/" + strconv.Itoa(1+i%2000) + "/raw"}, 16, 200)
	}
	after := peakRSS(b, cmd.Process.Pid)
	b.ReportMetric(after/(1<<20), "peak-MiB")
	b.ReportMetric((after-before)/(1<<20), "grew-MiB")
}
