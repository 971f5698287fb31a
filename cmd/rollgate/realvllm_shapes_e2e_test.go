package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/internal/testenv"
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
// (runs collapsed) and the shape of each kind's first event; and the finish
// reasons.
type answerShape struct {
	events []string          // streams: event kinds in order, runs collapsed
	shapes map[string]string // kind ("body" for a whole answer) -> shape
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
	for _, d := range sseEvents(body) {
		k := eventKind([]byte(d))
		if len(s.events) == 0 || s.events[len(s.events)-1] != k {
			s.events = append(s.events, k)
		}
		if _, ok := s.shapes[k]; ok || d == "[DONE]" {
			continue
		}
		if s.shapes[k], err = jsonShape([]byte(d)); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// TestMockMatchesRealVLLM sends the same requests to the mock engine
// (`rollgate mock --end-of-turn`, flavour vllm) and to a real vLLM 0.32.0
// (testenv.StartVLLM) and compares the answers' shapes: keys present and
// their order, the types of their values (null or a list of ids, ...), the
// order of a stream's event kinds, where usage and token ids appear, and
// the finish reasons. It keeps the mock faithful to the engine it claims
// to imitate; values that depend on the model are not compared.
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
	}
	for _, stream := range []bool{false, true} {
		reqs = append(reqs, req{true, stream, `"messages":[{"role":"user","content":"What is the weather in Paris?"}],"tools":` + realTools +
			`,"tool_choice":"required","max_tokens":64,"temperature":0,"return_token_ids":true`})
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
			var got [2]*answerShape
			for i, base := range []string{v.URL, mockURL} {
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
					got[i] = &answerShape{shapes: map[string]string{"error": fmt.Sprint(resp.StatusCode, " ", gjson.GetBytes(b, "error.message").Str)}}
					continue
				}
				if got[i], err = shapeAnswer(b, r.stream); err != nil {
					t.Fatal(err)
				}
			}
			real, mock := got[0], got[1]
			tools := strings.Contains(body, `"tools"`)
			// report fails on a difference, or logs it when it is one of
			// the mock's known gaps (docs/engines.md, "Checked against a
			// real vLLM"), named by gap.
			report := func(gap, format string, args ...any) {
				t.Helper()
				if gap == "" {
					t.Errorf(format, args...)
				} else {
					t.Logf("known mock gap (%s): "+format, append([]any{gap}, args...)...)
				}
			}
			const (
				gapWhole  = "whole answers lack vLLM 0.32.0's unset members and key order"
				gapFinish = "the mock sends the last token and the finish reason in separate chunks"
				gapTools  = "the mock does not imitate the hermes parser's streamed tool-call chunks, nor finish_reason stop on a named tool_choice"
			)
			if fmt.Sprint(real.events) != fmt.Sprint(mock.events) {
				gap := gapFinish
				if tools {
					gap = gapTools
				}
				report(gap, "stream event kinds\n vLLM %v\n mock %v", real.events, mock.events)
			}
			for k, rs := range real.shapes {
				if ms := mock.shapes[k]; ms != rs {
					gap := ""
					switch {
					case k == "body":
						gap = gapWhole
					case tools && (k == "empty" || k == "tool" || strings.HasSuffix(k, "+finish")):
						gap = gapTools
					case strings.HasSuffix(k, "+finish"):
						gap = gapFinish
					}
					report(gap, "shape of %s\n vLLM %s\n mock %s", k, rs, ms)
				}
			}
			if real.finish != mock.finish {
				report("", "finish reasons: vLLM %s, mock %s", real.finish, mock.finish)
			}
		})
	}
}
