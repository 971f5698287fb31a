package tokenize

import (
	"bytes"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export"
)

// Outcomes of the detokenisation check of one row.
const (
	// DetokMatch: the decoded output ids equal the returned text (after
	// dropping trailing special ids such as <|im_end|>).
	DetokMatch = "match"
	// DetokParsed: the returned text is a suffix of the decoded ids, and the
	// reasoning text (if any) lies in the cut prefix: a reasoning parser
	// removed its tags ("<think>...</think>").
	DetokParsed = "parsed"
	// DetokMismatch: the decoded ids do not give the returned text.
	DetokMismatch = "mismatch"
	// DetokSkipped: nothing to compare (no output ids, no text, tool calls
	// whose text was parsed and re-serialised, or a failed call).
	DetokSkipped = "skipped"
	// DetokDecodeError: an output id is unknown to the decoder (the wrong
	// vocabulary, or corrupt ids).
	DetokDecodeError = "decode_error"
)

// DetokRow is the detokenisation outcome of one row.
type DetokRow struct {
	SequenceID  uint64
	ChoiceIndex uint32
	Outcome     string
	// FirstDiff is the byte offset of the first difference between the
	// decoded text and the returned text (-1 unless Outcome is mismatch).
	FirstDiff int
}

// DetokReport sums up CheckDetokenization.
type DetokReport struct {
	Rows []DetokRow
	// Counts per outcome.
	Counts map[string]int
	// Mismatches is Counts[DetokMismatch] + Counts[DetokDecodeError].
	Mismatches int
}

// CheckDetokenization decodes each row's response_token_ids with decode and
// compares them with the text the engine returned (response_message: the
// chat message's content and reasoning, or a completion's text). special,
// when set, marks ids dropped from the end of the output before comparing
// (end-of-turn and EOS tokens the engine does not render as text); nil keeps
// every id. A local tokenizer's DecodeBytes and IsSpecial (package
// tokenize/hf) fit both.
//
// Chat messages with tool calls are skipped: their text was parsed by the
// engine's tool parser and cannot be compared byte for byte.
func CheckDetokenization(rows []export.Call, decode func([]uint32) ([]byte, error), special func(uint32) bool) DetokReport {
	rep := DetokReport{Counts: map[string]int{}}
	for i := range rows {
		r := &rows[i]
		d := DetokRow{SequenceID: r.SequenceID, ChoiceIndex: r.ChoiceIndex, FirstDiff: -1}
		d.Outcome, d.FirstDiff = detokRow(r, decode, special)
		rep.Rows = append(rep.Rows, d)
		rep.Counts[d.Outcome]++
		if d.Outcome == DetokMismatch || d.Outcome == DetokDecodeError {
			rep.Mismatches++
		}
	}
	return rep
}

func detokRow(r *export.Call, decode func([]uint32) ([]byte, error), special func(uint32) bool) (string, int) {
	if r.Error != "" || r.HTTPStatus >= 400 || len(r.ResponseTokenIDs) == 0 || r.ResponseMessage == "" {
		return DetokSkipped, -1
	}
	msg := gjson.Parse(r.ResponseMessage)
	var text, reasoning string
	switch {
	case msg.Get("text").Type == gjson.String:
		text = msg.Get("text").Str
	case msg.Get("tool_calls.#").Int() > 0:
		return DetokSkipped, -1
	default:
		text = msg.Get("content").Str
		for _, k := range []string{"reasoning_content", "reasoning"} {
			if v := msg.Get(k); v.Type == gjson.String {
				reasoning = v.Str
				break
			}
		}
	}
	if text == "" && reasoning == "" {
		return DetokSkipped, -1
	}
	ids := r.ResponseTokenIDs
	if special != nil {
		for len(ids) > 0 && special(ids[len(ids)-1]) {
			ids = ids[:len(ids)-1]
		}
	}
	got, err := decode(ids)
	if err != nil {
		return DetokDecodeError, -1
	}
	return CompareDecoded(got, text, reasoning)
}

// CompareDecoded compares decoded output bytes with the returned text (and
// the reasoning text a parser split off, "" when none). It returns DetokMatch,
// DetokParsed or DetokMismatch, and for a mismatch the byte offset of the
// first difference.
func CompareDecoded(decoded []byte, text, reasoning string) (string, int) {
	if reasoning == "" && string(decoded) == text {
		return DetokMatch, -1
	}
	if bytes.HasSuffix(decoded, []byte(text)) {
		prefix := decoded[:len(decoded)-len(text)]
		if reasoning != "" && bytes.Contains(prefix, []byte(reasoning)) {
			return DetokParsed, -1
		}
		if reasoning == "" && len(bytes.TrimSpace(prefix)) == 0 {
			// Only whitespace before the text: engines strip a leading space.
			return DetokParsed, -1
		}
	}
	n := min(len(decoded), len(text))
	for i := 0; i < n; i++ {
		if decoded[i] != text[i] {
			return DetokMismatch, i
		}
	}
	return DetokMismatch, n
}
