package gateway

import (
	"strings"
	"testing"
)

// TestNotObjectMessage: a body that is no JSON object gets what is wrong
// with it (where, for a syntax error) and mentions the Content-Type only
// when the request's was not JSON.
func TestNotObjectMessage(t *testing.T) {
	for _, tc := range []struct {
		body, ct string
		want     []string
		not      []string
	}{
		{"", "application/json", []string{"request body is empty", `"messages"`}, []string{"Content-Type"}},
		{"  \n", "", []string{"request body is empty"}, []string{"Content-Type"}},
		{`{"model":"m",}`, "application/json", []string{"not valid JSON", "looking for beginning of object key string", "byte 14", "line 1, column 14"}, []string{"Content-Type"}},
		{"{\n  \"model\": \"m\"\n  \"messages\": []\n}", "application/json; charset=utf-8", []string{"after object key:value pair", "line 3, column 3"}, []string{"Content-Type"}},
		{`{"model":`, "application/json", []string{"not valid JSON", "unexpected end of JSON input"}, nil},
		{`[1,2]`, "application/json", []string{"a JSON array, not an object"}, []string{"Content-Type"}},
		{`"hi"`, "", []string{"a JSON string, not an object"}, nil},
		{`model=m`, "application/x-www-form-urlencoded", []string{"not valid JSON", `Content-Type is "application/x-www-form-urlencoded"`, "Content-Type: application/json"}, nil},
		{"{\"model\":\"\xff\"}", "application/json", []string{"valid UTF-8"}, []string{"Content-Type"}},
	} {
		got := notObjectMessage([]byte(tc.body), []byte(tc.ct))
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("body %q, Content-Type %q: %q lacks %q", tc.body, tc.ct, got, w)
			}
		}
		for _, w := range tc.not {
			if strings.Contains(got, w) {
				t.Errorf("body %q, Content-Type %q: %q has %q", tc.body, tc.ct, got, w)
			}
		}
	}
}

// FuzzNotObjectMessage: any body gets a message, never a panic.
func FuzzNotObjectMessage(f *testing.F) {
	for _, s := range []string{"", "{", `{"a":1,}`, "\n\n}", `[1]`, "\xff"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if notObjectMessage(body, []byte("text/plain")) == "" {
			t.Fatal("empty message")
		}
	})
}
