package tokenize_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/tokenize"
)

func TestCompareDecoded(t *testing.T) {
	for _, tc := range []struct {
		decoded, text, reasoning string
		want                     string
		diff                     int
	}{
		{"Hello world", "Hello world", "", tokenize.DetokMatch, -1},
		{"", "", "", tokenize.DetokMatch, -1},
		{"<think>\nplan\n</think>\n\nanswer", "answer", "\nplan\n", tokenize.DetokParsed, -1},
		{" answer", "answer", "", tokenize.DetokParsed, -1},
		{"Hello world", "Hello wordl", "", tokenize.DetokMismatch, 9},
		{"Hello", "Hello world", "", tokenize.DetokMismatch, 5},
		{"Hello world", "Hello", "", tokenize.DetokMismatch, 5},
		{"xx answer", "answer", "", tokenize.DetokMismatch, 0},
		{"<think>a</think>answer", "answer", "zzz", tokenize.DetokMismatch, 0},
		{"caf\xc3", "café", "", tokenize.DetokMismatch, 4},
	} {
		got, diff := tokenize.CompareDecoded([]byte(tc.decoded), tc.text, tc.reasoning)
		if got != tc.want || diff != tc.diff {
			t.Errorf("CompareDecoded(%q, %q, %q) = %s %d, want %s %d", tc.decoded, tc.text, tc.reasoning, got, diff, tc.want, tc.diff)
		}
	}
}

// toy decoder: id i is the byte i; ids >= 256 are unknown, 255 is "special".
func toyDecode(ids []uint32) ([]byte, error) {
	var b []byte
	for _, id := range ids {
		if id >= 256 {
			return nil, fmt.Errorf("unknown id %d", id)
		}
		b = append(b, byte(id))
	}
	return b, nil
}

func bytesIDs(s string) []uint32 {
	ids := make([]uint32, len(s))
	for i := range s {
		ids[i] = uint32(s[i])
	}
	return ids
}

func TestCheckDetokenization(t *testing.T) {
	row := func(ids []uint32, msg string) export.Call {
		return export.Call{ResponseTokenIDs: ids, ResponseMessage: msg}
	}
	rows := []export.Call{
		row(append(bytesIDs("hi"), 255), `{"role":"assistant","content":"hi"}`),                            // match after dropping the special
		row(bytesIDs("<think>r</think>ok"), `{"role":"assistant","content":"ok","reasoning_content":"r"}`), // parsed
		row(bytesIDs("hi"), `{"role":"assistant","content":"ho"}`),                                         // mismatch
		row(bytesIDs("abc"), `{"text":"abc"}`),                                                             // completions match
		row(bytesIDs("x"), `{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f"}}]}`), // skipped
		row(nil, `{"role":"assistant","content":"hi"}`),                                                    // skipped: no ids
		row([]uint32{300}, `{"role":"assistant","content":"hi"}`),                                          // decode error
		{ResponseTokenIDs: bytesIDs("a"), ResponseMessage: `{"text":"a"}`, HTTPStatus: 500},                // skipped: failed
		row(bytesIDs("a"), `{"role":"assistant","content":""}`),                                            // skipped: no text
		row(bytesIDs("<think>r</think>"), `{"role":"assistant","content":"","reasoning":"r"}`),             // parsed (reasoning only)
	}
	rep := tokenize.CheckDetokenization(rows, toyDecode, func(id uint32) bool { return id == 255 })
	var got []string
	for _, r := range rep.Rows {
		got = append(got, r.Outcome)
	}
	want := "match parsed mismatch match skipped skipped decode_error skipped skipped parsed"
	if strings.Join(got, " ") != want {
		t.Fatalf("outcomes\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	if rep.Mismatches != 2 || rep.Counts[tokenize.DetokSkipped] != 4 || rep.Rows[2].FirstDiff != 1 {
		t.Fatalf("report %+v", rep)
	}
	// Without the special filter, the trailing id breaks the first row.
	if rep := tokenize.CheckDetokenization(rows[:1], toyDecode, nil); rep.Mismatches != 1 {
		t.Fatalf("no special filter: %+v", rep)
	}
}

// TestCheckDetokenizationMock decodes the mock engine's ids with its own
// tokenizer: every choice matches; with dropped chunks, the streamed ids no
// longer give the text and the check counts it.
func TestCheckDetokenizationMock(t *testing.T) {
	decode := func(ids []uint32) ([]byte, error) {
		for _, id := range ids {
			if int(id) >= mock.VocabSize() {
				return nil, fmt.Errorf("id %d", id)
			}
		}
		return []byte(mock.Decode(ids)), nil
	}
	special := func(id uint32) bool { return id >= mock.TokenEndOfText && id <= mock.TokenIMEnd }
	for _, tc := range []struct {
		name       string
		cfg        mock.Config
		stream     bool
		mismatches bool
	}{
		{"non-streaming", mock.Config{}, false, false},
		{"streaming", mock.Config{}, true, false},
		{"dropped chunks", mock.Config{DropIDsEvery: 2}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, base, err := mock.Start(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Shutdown()
			req := `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":3,"max_tokens":12,"return_token_ids":true`
			if tc.stream {
				req += `,"stream":true,"stream_options":{"include_usage":true}`
			}
			req += "}"
			resp, err := http.Post(base+"/chat/completions", "application/json", strings.NewReader(req))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			p := capture.AcquirePending()
			p.Meta = export.Call{Endpoint: "/v1/chat/completions", HTTPStatus: 200}
			p.Endpoint = openai.ChatCompletions
			p.Request = req
			if tc.stream {
				for _, line := range bytes.Split(body, []byte("\n")) {
					if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
						p.AddEvent(d)
					}
				}
			} else {
				p.Body = body
			}
			var a capture.Assembler
			rows := capture.Rows(p, &a)
			if len(rows) != 3 || gjson.Get(rows[0].ResponseMessage, "content").Str == "" {
				t.Fatalf("rows %+v", rows)
			}
			rep := tokenize.CheckDetokenization(rows, decode, special)
			if tc.mismatches {
				if rep.Mismatches == 0 {
					t.Fatalf("dropped chunks not detected: %+v", rep)
				}
			} else if rep.Counts[tokenize.DetokMatch] != 3 {
				t.Fatalf("report %+v", rep)
			}
		})
	}
}

func BenchmarkCheckDetokenization(b *testing.B) {
	text := strings.Repeat("the quick brown fox ", 50)
	rows := []export.Call{{ResponseTokenIDs: bytesIDs(text), ResponseMessage: `{"role":"assistant","content":"` + text + `"}`}}
	b.ReportAllocs()
	for b.Loop() {
		if tokenize.CheckDetokenization(rows, toyDecode, nil).Mismatches != 0 {
			b.Fatal("mismatch")
		}
	}
}
