package capture

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// sseEv is a copied event, for comparisons.
type sseEv struct {
	Data, Name string
	HasData    bool
	HasName    bool
}

func (e sseEv) String() string {
	return fmt.Sprintf("{data=%q(%v) name=%q(%v)}", e.Data, e.HasData, e.Name, e.HasName)
}

func copyEv(ev Event) sseEv {
	return sseEv{Data: string(ev.Data), Name: string(ev.Name), HasData: ev.Data != nil, HasName: ev.Name != nil}
}

// scanAll feeds chunks one after the other, drains Next after each, then
// Finish. It returns the events that carry a field (data or event name), and
// checks that the Raw bytes of all events plus the final Raw rebuild input.
func scanAll(t testing.TB, s *SSEScanner, input []byte, chunks [][]byte) []sseEv {
	return scanAllLettingGo(t, s, input, chunks, false)
}

// scanAllLettingGo is scanAll; with letGo, the scanner lends its buffers
// back (LetGo) after every chunk's events, as a stream between two reads.
func scanAllLettingGo(t testing.TB, s *SSEScanner, input []byte, chunks [][]byte, letGo bool) []sseEv {
	t.Helper()
	var evs []sseEv
	var raw []byte
	for _, c := range chunks {
		s.Feed(c)
		for {
			ev, ok := s.Next()
			if !ok {
				break
			}
			if len(ev.Raw) == 0 {
				t.Fatalf("event with empty Raw")
			}
			raw = append(raw, ev.Raw...)
			if ev.Data != nil || ev.Name != nil {
				evs = append(evs, copyEv(ev))
			}
		}
		if letGo {
			s.LetGo()
		}
	}
	rest := string(s.Rest())
	ev, ok := s.Finish()
	if string(ev.Raw) != rest {
		t.Fatalf("Finish Raw %q != Rest %q", ev.Raw, rest)
	}
	raw = append(raw, ev.Raw...)
	if ok && (ev.Data != nil || ev.Name != nil) {
		evs = append(evs, copyEv(ev))
	}
	if !bytes.Equal(raw, input) {
		t.Fatalf("concatenated Raw differs from input:\n got %q\nwant %q", raw, input)
	}
	if len(s.Rest()) != 0 {
		t.Fatalf("Rest after Finish = %q", s.Rest())
	}
	return evs
}

// chunkings returns several ways to split in: whole, byte by byte, and
// random cuts from a fixed seed.
func chunkings(in []byte, seed uint64) [][][]byte {
	whole := [][]byte{in}
	var bytewise [][]byte
	for i := range in {
		bytewise = append(bytewise, in[i:i+1])
	}
	out := [][][]byte{whole, bytewise}
	r := rand.New(rand.NewPCG(seed, 7))
	for range 5 {
		var cs [][]byte
		rest := in
		for len(rest) > 0 {
			n := 1 + r.IntN(min(len(rest), 17))
			cs = append(cs, rest[:n])
			rest = rest[n:]
		}
		out = append(out, cs)
	}
	return out
}

func TestSSEScanner(t *testing.T) {
	d := func(data string) sseEv { return sseEv{Data: data, HasData: true} }
	f := func(name, in string, want ...sseEv) {
		t.Helper()
		t.Run(name, func(t *testing.T) {
			for i, cs := range chunkings([]byte(in), uint64(len(in))) {
				var s SSEScanner
				got := scanAll(t, &s, []byte(in), cs)
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("chunking %d (%d chunks):\n got %v\nwant %v", i, len(cs), got, want)
				}
			}
		})
	}
	f("lf", "data: {\"a\":1}\n\ndata: [DONE]\n\n", d(`{"a":1}`), d("[DONE]"))
	f("crlf", "data: a\r\n\r\ndata: b\r\n\r\n", d("a"), d("b"))
	f("cr", "data: a\r\rdata: b\r\r", d("a"), d("b"))
	f("mixed terminators", "data: a\r\ndata: b\rdata: c\n\r\n", d("a\nb\nc"))
	f("no space", "data:x\n\n", d("x"))
	f("only one space dropped", "data:  x \n\n", d(" x "))
	f("multi-line data", "data: line1\ndata: line2\ndata:\n\n", d("line1\nline2\n"))
	f("empty data", "data:\n\n", d(""))
	f("field without colon", "data\n\n", d(""))
	f("comments", ": keep-alive\n\n: hi\ndata: x\n: bye\n\n", d("x"))
	f("event name", "event: response.completed\ndata: {}\n\n",
		sseEv{Data: "{}", HasData: true, Name: "response.completed", HasName: true})
	f("id and retry ignored", "id: 7\nretry: 10\ndata: x\n\n", d("x"))
	f("unknown field", "foo: bar\ndata: x\n\n", d("x"))
	f("stray blank lines", "\n\n\r\ndata: x\n\n\n\n", d("x"))
	f("missing final blank line", "data: a\n\ndata: b\n", d("a"), d("b"))
	f("missing final line terminator", "data: a\n\ndata: b", d("a"), d("b"))
	f("final CR", "data: a\r", d("a"))
	f("final CRLF", "data: a\r\n", d("a"))
	f("colon in value", "data: {\"k\":\"a:b\"}\n\n", d(`{"k":"a:b"}`))
	f("empty", "")
	f("only terminators", "\r\n\r\n")
	f("keepalive only", ": ping\n\n")
}

// TestSSEScannerRawBoundaries pins where Raw starts and ends.
func TestSSEScannerRawBoundaries(t *testing.T) {
	var s SSEScanner
	s.Feed([]byte("data: a\r\n\r\ndata: b\n\n: c\n\ndata: partial"))
	var raws []string
	for {
		ev, ok := s.Next()
		if !ok {
			break
		}
		raws = append(raws, string(ev.Raw))
	}
	want := []string{"data: a\r\n\r\n", "data: b\n\n", ": c\n\n"}
	if fmt.Sprint(raws) != fmt.Sprint(want) {
		t.Fatalf("raws = %q, want %q", raws, want)
	}
	if got := string(s.Rest()); got != "data: partial" {
		t.Fatalf("Rest = %q", got)
	}
	s.Feed([]byte("\n\n"))
	ev, ok := s.Next()
	if !ok || string(ev.Data) != "partial" || string(ev.Raw) != "data: partial\n\n" {
		t.Fatalf("after completing: %q %q %v", ev.Raw, ev.Data, ok)
	}

	// A CR that ends an event at the end of the buffer: the LF that follows
	// later starts the next event's Raw, and is not a blank line.
	s.Reset()
	s.Feed([]byte("data: a\r\n\r"))
	ev, ok = s.Next()
	if !ok || string(ev.Raw) != "data: a\r\n\r" {
		t.Fatalf("CR at end: %q %v", ev.Raw, ok)
	}
	s.Feed([]byte("\ndata: b\r\n\r\n"))
	ev, ok = s.Next()
	if !ok || string(ev.Raw) != "\ndata: b\r\n\r\n" || string(ev.Data) != "b" {
		t.Fatalf("after CR: %q %q %v", ev.Raw, ev.Data, ok)
	}
	if _, ok := s.Next(); ok {
		t.Fatal("unexpected extra event")
	}
}

func TestSSEScannerFinish(t *testing.T) {
	var s SSEScanner
	if ev, ok := s.Finish(); ok || len(ev.Raw) != 0 {
		t.Fatalf("empty Finish = %q %v", ev.Raw, ok)
	}
	// Finish without draining Next first returns the pending events in order.
	s.Feed([]byte("data: 1\n\ndata: 2"))
	var got []string
	for {
		ev, ok := s.Finish()
		if !ok {
			break
		}
		got = append(got, string(ev.Data))
	}
	if fmt.Sprint(got) != "[1 2]" {
		t.Fatalf("got %q", got)
	}
	// A lone LF left from a CRLF is no event, but is returned to forward.
	s.Reset()
	s.Feed([]byte("data: x\r\n\r"))
	if _, ok := s.Next(); !ok {
		t.Fatal("no event")
	}
	s.Feed([]byte("\n"))
	if _, ok := s.Next(); ok {
		t.Fatal("LF of CRLF made an event")
	}
	if ev, ok := s.Finish(); ok || string(ev.Raw) != "\n" {
		t.Fatalf("Finish = %q %v", ev.Raw, ok)
	}
}

// TestSSEScannerLargeEvent checks that an event much larger than each Feed is
// assembled (and scanned linearly) correctly.
func TestSSEScannerLargeEvent(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	in := []byte("data: " + big + "\ndata: y\n\n")
	var s SSEScanner
	n := 0
	for off := 0; off < len(in); off += 4096 {
		s.Feed(in[off:min(off+4096, len(in))])
		for {
			ev, ok := s.Next()
			if !ok {
				break
			}
			n++
			if string(ev.Data) != big+"\ny" {
				t.Fatalf("data len %d", len(ev.Data))
			}
		}
	}
	if n != 1 {
		t.Fatalf("%d events", n)
	}
}

func TestSSEScannerZeroAlloc(t *testing.T) {
	ev := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"w"},"logprobs":null,"finish_reason":null,"token_ids":[17]}]}` + "\n\n")
	var s SSEScanner
	run := func() {
		s.Feed(ev[:40])
		if _, ok := s.Next(); ok {
			t.Fatal("early event")
		}
		s.Feed(ev[40:])
		if e, ok := s.Next(); !ok || len(e.Data) == 0 {
			t.Fatal("no event")
		}
	}
	run() // warm the buffers
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Fatalf("%v allocations per event, want 0", n)
	}
}

// FuzzSSEScanner: however the input is cut into Feeds, and whether or not
// the scanner lends its buffers back between them, the events are the same
// and their Raw bytes give back the input.
func FuzzSSEScanner(f *testing.F) {
	for _, s := range []string{
		"data: a\n\n", "data: a\r\n\r\n", "data: a\r\rdata: b\r", ":c\n\ndata:x\ndata: y\n\n",
		"event: e\ndata: {}\n\n", "\r\n\r", "data", "data: a\r\n\r\ndata: b\n",
	} {
		f.Add([]byte(s), uint64(1))
	}
	f.Fuzz(func(t *testing.T, in []byte, seed uint64) {
		var want []sseEv
		for i, cs := range chunkings(in, seed) {
			var s SSEScanner
			// Every other chunking lends the buffers back between chunks
			// (LetGo): the events must not change.
			got := scanAllLettingGo(t, &s, in, cs, i%2 == 1)
			if i == 0 {
				want = got
				continue
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("chunking %d:\n got %v\nwant %v", i, got, want)
			}
		}
	})
}

// benchStream is a realistic vLLM chat stream of n token chunks (with
// return_token_ids and include_usage), some tokens needing JSON escapes.
func benchStream(n int) []byte { return benchStreamOf(n, false) }

// benchStreamOf is benchStream; with logprobs, every token's chunk carries
// its sampled token's logprobs entry, as vLLM sends them when the gateway
// asks for them ("logprobs": true, no alternatives).
func benchStreamOf(n int, logprobs bool) []byte {
	var b bytes.Buffer
	b.WriteString(`data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1730000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[151644,8948,198,2610,525,264,10950,17847,13,151645,198,151644,872,198]}` + "\n\n")
	for i := range n {
		content := fmt.Sprintf(" tok%d", i)
		switch i % 8 {
		case 3:
			content = `\n` // escaped newline, as engines send it
		case 6:
			content = " café"
		}
		lp := "null"
		if logprobs {
			raw, _ := strconv.Unquote(`"` + content + `"`)
			bs := make([]string, len(raw))
			for j := range len(raw) {
				bs[j] = strconv.Itoa(int(raw[j]))
			}
			lp = fmt.Sprintf(`{"content":[{"token":"%s","logprob":%s,"bytes":[%s],"top_logprobs":[]}]}`,
				content, strconv.FormatFloat(-float64(i%17)/7, 'f', -1, 64), strings.Join(bs, ","))
		}
		fmt.Fprintf(&b, `data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1730000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"%s"},"logprobs":%s,"finish_reason":null,"token_ids":[%d]}]}`+"\n\n", content, lp, 1000+i)
	}
	b.WriteString(`data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1730000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[]}]}` + "\n\n")
	fmt.Fprintf(&b, `data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1730000000,"model":"Qwen/Qwen3-8B","choices":[],"usage":{"prompt_tokens":14,"total_tokens":%d,"completion_tokens":%d}}`+"\n\n", 14+n, n)
	b.WriteString("data: [DONE]\n\n")
	return b.Bytes()
}

func BenchmarkSSEScanner(b *testing.B) {
	stream := benchStream(256)
	const read = 4096 // bytes per upstream read
	var s SSEScanner
	events := 0
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		s.Reset()
		events = 0
		for off := 0; off < len(stream); off += read {
			s.Feed(stream[off:min(off+read, len(stream))])
			for {
				if _, ok := s.Next(); !ok {
					break
				}
				events++
			}
		}
	}
	if events != 256+4 {
		b.Fatalf("%d events", events)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
}
