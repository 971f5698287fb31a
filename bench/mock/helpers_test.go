package mock

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func startT(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	s, base, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Shutdown(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return s, base
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func do(t *testing.T, method, url, body string, hdr ...string) resp {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatalf("read body of %s: %v", url, err)
	}
	return resp{status: r.StatusCode, header: r.Header, body: b}
}

func post(t *testing.T, url, body string, hdr ...string) resp {
	t.Helper()
	return do(t, http.MethodPost, url, body, hdr...)
}

// mustOK asserts a 200 JSON answer and returns it parsed.
func mustOK(t *testing.T, r resp) gjson.Result {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("status %d, body %s", r.status, r.body)
	}
	if !gjson.ValidBytes(r.body) {
		t.Fatalf("invalid JSON: %s", r.body)
	}
	return gjson.ParseBytes(r.body)
}

type sseEvent struct {
	name string
	data string
}

// parseSSE splits an SSE body into events, checking the framing.
func parseSSE(t *testing.T, body []byte) []sseEvent {
	t.Helper()
	var evs []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.data == "" {
				t.Fatalf("empty event in %q", body)
			}
			evs = append(evs, cur)
			cur = sseEvent{}
		case strings.HasPrefix(line, "event: "):
			cur.name = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			cur.data = line[len("data: "):]
			if cur.data != "[DONE]" && !gjson.Valid(cur.data) {
				t.Fatalf("invalid JSON event: %s", cur.data)
			}
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	if cur.data != "" {
		t.Fatalf("unterminated event %q", cur.data)
	}
	return evs
}

// ids reads a JSON array of ids.
func ids(v gjson.Result) []uint32 {
	var out []uint32
	for _, x := range v.Array() {
		out = append(out, uint32(x.Uint()))
	}
	return out
}

func eqIDs(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// streamedChat collects per-choice text, ids, finish reasons and more from chat chunks.
type streamedChat struct {
	text       map[int]string
	args       map[int]string
	ids        map[int][]uint32
	finish     map[int]string
	lpCount    map[int]int
	idsKeys    int // chunks that carry a token_ids key
	promptIDs  gjson.Result
	usage      gjson.Result
	ids0       string
	doneSeen   bool
	roleChunks int
}

func collectChat(t *testing.T, evs []sseEvent) *streamedChat {
	t.Helper()
	sc := &streamedChat{text: map[int]string{}, args: map[int]string{}, ids: map[int][]uint32{},
		finish: map[int]string{}, lpCount: map[int]int{}}
	for n, ev := range evs {
		if ev.data == "[DONE]" {
			if n != len(evs)-1 {
				t.Fatalf("[DONE] is not last")
			}
			sc.doneSeen = true
			continue
		}
		j := gjson.Parse(ev.data)
		if j.Get("object").Str != "chat.completion.chunk" {
			t.Fatalf("chunk object %q: %s", j.Get("object").Str, ev.data)
		}
		if sc.ids0 == "" {
			sc.ids0 = j.Get("id").Str
		} else if j.Get("id").Str != sc.ids0 {
			t.Fatalf("chunk ids differ")
		}
		// vLLM writes prompt_token_ids on every choice's role chunk (null
		// when not asked), and on no other chunk.
		if p := j.Get("prompt_token_ids"); p.Exists() {
			if role := j.Get("choices.0.delta.role"); !role.Exists() {
				t.Fatalf("prompt_token_ids on chunk %d, not a role chunk", n)
			}
			if n == 0 {
				sc.promptIDs = p
			} else if p.Raw != sc.promptIDs.Raw {
				t.Fatalf("prompt_token_ids on chunk %d differ from the first's", n)
			}
		}
		if u := j.Get("usage"); u.Exists() && u.Type != gjson.Null {
			if len(j.Get("choices").Array()) != 0 {
				t.Fatalf("usage chunk with choices: %s", ev.data)
			}
			sc.usage = u
			continue
		}
		for _, c := range j.Get("choices").Array() {
			i := int(c.Get("index").Int())
			d := c.Get("delta")
			if d.Get("role").Exists() {
				sc.roleChunks++
			}
			sc.text[i] += d.Get("content").Str
			for _, tc := range d.Get("tool_calls").Array() {
				sc.args[i] += tc.Get("function.arguments").Str
			}
			if tid := c.Get("token_ids"); tid.Exists() {
				sc.idsKeys++
				sc.ids[i] = append(sc.ids[i], ids(tid)...)
			}
			sc.lpCount[i] += len(c.Get("logprobs.content").Array())
			if f := c.Get("finish_reason"); f.Type == gjson.String {
				sc.finish[i] = f.Str
			}
		}
	}
	return sc
}
