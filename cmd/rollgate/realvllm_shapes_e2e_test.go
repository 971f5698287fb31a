package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/testkit/testenv"
)

// jsonShape writes the shape of one JSON document: objects with their keys
// in order, each value replaced by its type (s, n, b, null), arrays by the
// shapes of their elements with repeats collapsed. Values that depend on the
// model (text, ids, logprobs, counts) vanish; where keys sit, whether a
// field is null or a list, and in which order keys come, stay.
func jsonShape(doc []byte) (string, error) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var b strings.Builder
	if err := shapeValue(d, &b, false); err != nil {
		return "", fmt.Errorf("shape of %.200s: %w", doc, err)
	}
	return b.String(), nil
}

// shapeValue writes the shape of the next value of d. In tokenMaps, an
// object is a map from token text to logprob (completions' top_logprobs),
// written {*:n} whatever its keys and their count.
func shapeValue(d *json.Decoder, b *strings.Builder, tokenMaps bool) error {
	tok, err := d.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		if v == '{' {
			var o strings.Builder
			o.WriteByte('{')
			tokenMap := tokenMaps
			for first := true; d.More(); first = false {
				k, err := d.Token()
				if err != nil {
					return err
				}
				if !first {
					o.WriteByte(',')
				}
				key := fmt.Sprint(k)
				tokenMap = tokenMap && key != "token"
				o.WriteString(key + ":")
				if err := shapeValue(d, &o, key == "top_logprobs"); err != nil {
					return err
				}
			}
			o.WriteByte('}')
			if tokenMap {
				b.WriteString("{*:n}")
			} else {
				b.WriteString(o.String())
			}
		} else {
			b.WriteByte('[')
			prev := ""
			for first := true; d.More(); {
				var e strings.Builder
				if err := shapeValue(d, &e, tokenMaps); err != nil {
					return err
				}
				if e.String() == prev {
					continue
				}
				if !first {
					b.WriteByte(',')
				}
				first, prev = false, e.String()
				b.WriteString(prev)
			}
			b.WriteByte(']')
		}
		_, err := d.Token() // the closing delimiter
		return err
	case string:
		b.WriteString("s")
	case json.Number:
		b.WriteString("n")
	case bool:
		b.WriteString("b")
	case nil:
		b.WriteString("null")
	}
	return nil
}

// answerShape is what TestMockMatchesRealVLLM compares of one answer: the
// body's shape (whole answers), or the order of the stream's event kinds
// per choice (runs collapsed) and, per kind, the distinct shapes of its events in order
// of appearance; and the finish reasons.
type answerShape struct {
	events []string          // streams: event kinds in order per choice, runs collapsed
	shapes map[string]string // kind ("body" for a whole answer) -> its shapes
	finish string
}

// shapeAnswer computes an answer's shape.
func shapeAnswer(body []byte, stream bool) (*answerShape, error) {
	s := &answerShape{shapes: map[string]string{}}
	a, err := parseAnswer(body, stream)
	if err != nil {
		return nil, err
	}
	s.finish = fmt.Sprint(a.finish)
	if !stream {
		s.shapes["body"], err = jsonShape(body)
		return s, err
	}
	seen := map[string]bool{}
	// Event kinds per choice, then those of no choice (usage, [DONE]): how
	// the choices of n > 1 interleave is the engine's scheduling (a choice
	// may start a step after another), not its format.
	perChoice := map[int64][]string{}
	var rest []string
	add := func(seq []string, k string) []string {
		if len(seq) == 0 || seq[len(seq)-1] != k {
			seq = append(seq, k)
		}
		return seq
	}
	for _, d := range sseEvents(body) {
		k := eventKind([]byte(d))
		if idx := gjson.Get(d, "choices.0.index"); idx.Exists() {
			perChoice[idx.Int()] = add(perChoice[idx.Int()], k)
		} else {
			rest = add(rest, k)
		}
		if d == "[DONE]" {
			continue
		}
		sh, err := jsonShape([]byte(d))
		if err != nil {
			return nil, err
		}
		if !seen[k+" "+sh] {
			seen[k+" "+sh] = true
			s.shapes[k] += sh + "\n"
		}
	}
	for _, i := range slices.Sorted(maps.Keys(perChoice)) {
		s.events = append(s.events, fmt.Sprintf("choice %d:", i))
		s.events = append(s.events, perChoice[i]...)
	}
	s.events = append(s.events, rest...)
	return s, nil
}

// diff describes how two shapes differ, "" when they do not.
func (real *answerShape) diff(mock *answerShape) string {
	var b strings.Builder
	if fmt.Sprint(real.events) != fmt.Sprint(mock.events) {
		fmt.Fprintf(&b, "stream event kinds\n vLLM %v\n mock %v\n", real.events, mock.events)
	}
	kinds := map[string]bool{}
	for k := range real.shapes {
		kinds[k] = true
	}
	for k := range mock.shapes {
		kinds[k] = true
	}
	for _, k := range slices.Sorted(maps.Keys(kinds)) {
		if rs, ms := real.shapes[k], mock.shapes[k]; rs != ms {
			fmt.Fprintf(&b, "shapes of %s\n vLLM %s\n mock %s\n", k, rs, ms)
		}
	}
	if real.finish != mock.finish {
		fmt.Fprintf(&b, "finish reasons: vLLM %s, mock %s\n", real.finish, mock.finish)
	}
	return b.String()
}

// TestMockMatchesRealVLLM sends the same requests to the mock engine
// (`rollgate mock --end-of-turn`, flavour vllm) and to a real vLLM 0.32.0
// (testenv.StartVLLM, hermes tool parser on) and fails on any difference of
// shape: keys present and their order, null members, the types of their
// values (null or a list of ids, ...), the order of a stream's event kinds
// and each kind's chunk shapes, where usage and token ids appear, refusals,
// and the finish reasons. It keeps the mock faithful to the engine it claims
// to imitate, so that a drift of either fails; ids, timestamps and values
// that depend on the model (text, token ids, logprobs, counts) are masked.
// A stream the engine chunked otherwise (it merges the outputs of steps its
// API server has not yet sent, under load) is asked again, at most 4 times.
func TestMockMatchesRealVLLM(t *testing.T) {
	v, err := testenv.StartVLLM()
	if err != nil {
		t.Fatalf("TestMockMatchesRealVLLM needs a real vLLM (set %s, or let testenv.StartVLLM start one): %v", testenv.EnvVLLMURL, err)
	}
	t.Cleanup(v.Stop)
	mockAddr := freeAddr(t)
	start(t, mockAddr, "/health", "mock", "--listen", mockAddr, "--end-of-turn")
	mockURL := "http://" + mockAddr + "/v1"

	type req struct {
		chat, stream bool
		extra        string // request members after the model's
	}
	var reqs []req
	for _, chat := range []bool{true, false} {
		prompt := `"prompt":"The capital of France is"`
		if chat {
			prompt = `"messages":[{"role":"user","content":"Say hi"}]`
		}
		for _, stream := range []bool{false, true} {
			for _, asked := range []string{"", `,"return_token_ids":true`, `,"logprobs":1`, `,"return_token_ids":true,"logprobs":1,"n":2,"temperature":1,"seed":7`, `,"n":2`} {
				if chat {
					asked = strings.Replace(asked, `"logprobs":1`, `"logprobs":true`, 1)
				}
				if stream && asked != "" {
					asked += `,"stream_options":{"include_usage":true}`
				}
				temp := `,"temperature":0`
				if strings.Contains(asked, `"temperature"`) {
					temp = "" // n > 1 needs sampling
				}
				if asked == `,"n":2` && stream {
					continue // greedy n > 1 is refused before any stream
				}
				reqs = append(reqs, req{chat, stream, prompt + `,"max_tokens":4` + temp + asked})
			}
		}
		// Usage on every chunk.
		reqs = append(reqs, req{chat, true, prompt + `,"max_tokens":4,"temperature":0,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`})
		// Stop strings: vLLM holds back text (len(longest stop)-1
		// characters) until the finish. Each list holds a string the real
		// model's answer reaches (" meet", "\n\n") and one the mock's does
		// (" year", " dog"), so both stop on a string, and a long one that
		// neither writes, so that both hold back their first tokens whole
		// (empty chat deltas) whatever their lengths.
		stop := `,"stop":["\n\n"," dog","##########"]`
		if chat {
			stop = `,"stop":[" meet"," year","##########"]`
		}
		for _, stream := range []bool{false, true} {
			for _, asked := range []string{"", `,"return_token_ids":true`} {
				reqs = append(reqs, req{chat, stream, prompt + `,"max_tokens":12,"temperature":0` + stop + asked})
			}
		}
	}
	// Answers that end on the end-of-turn token.
	eot := `"messages":[{"role":"user","content":"What is 2+2? Answer with the number only."}],"max_tokens":24,"temperature":0`
	eotPrompt := `"prompt":"<|im_start|>user\nWhat is 2+2? Answer with the number only.<|im_end|>\n<|im_start|>assistant\n","max_tokens":24,"temperature":0`
	for _, stream := range []bool{false, true} {
		for _, asked := range []string{"", `,"return_token_ids":true`} {
			reqs = append(reqs, req{true, stream, eot + asked}, req{false, stream, eotPrompt + asked})
		}
	}
	// Tool calls forced by a named or "required" tool_choice (vLLM's
	// structured output makes the tiny model write one; the hermes parser
	// reads it). "auto" is left out: the real model then answers in text
	// where the mock calls the tool, a difference of model, not of format.
	weather := `"messages":[{"role":"user","content":"What is the weather in Paris?"}],"tools":` + realTools
	for _, choice := range []string{`"required"`, `{"type":"function","function":{"name":"get_weather"}}`} {
		for _, stream := range []bool{false, true} {
			for _, asked := range []string{"", `,"return_token_ids":true`, `,"logprobs":true`} {
				reqs = append(reqs, req{true, stream, weather + `,"tool_choice":` + choice + `,"max_tokens":64,"temperature":0` + asked})
			}
		}
	}
	for _, r := range reqs {
		path := "/completions"
		if r.chat {
			path = "/chat/completions"
		}
		if r.stream {
			r.extra += `,"stream":true`
		}
		body := `{"model":"` + testenv.VLLMModel + `",` + r.extra + `}`
		t.Run(path+"/"+r.extra, func(t *testing.T) {
			shape := func(base string) *answerShape {
				resp, err := realClient.Post(base+path, "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != 200 {
					// A refusal: both must refuse alike (status, message).
					return &answerShape{shapes: map[string]string{"error": fmt.Sprint(resp.StatusCode, " ", gjson.GetBytes(b, "error.message").Str)}}
				}
				s, err := shapeAnswer(b, r.stream)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			mock := shape(mockURL)
			for attempt := 1; ; attempt++ {
				d := shape(v.URL).diff(mock)
				if d == "" {
					break
				}
				if !r.stream || attempt == 4 {
					t.Fatalf("the mock's answer differs from vLLM's (attempt %d):\n%s", attempt, d)
				}
				t.Logf("attempt %d: the engine's stream differs; again (it may have merged steps):\n%s", attempt, d)
			}
		})
	}
}
