// Package hf is a local tokenizer for data captured without token ids: it
// loads a Hugging Face tokenizer.json of the byte-level BPE family (GPT-2,
// Llama 3, Qwen 2/2.5/3, DeepSeek-style files with one split regex) and
// encodes and decodes text, with github.com/pkoukk/tiktoken-go as the BPE
// core. It also offers the tiktoken vocabularies cl100k_base and o200k_base,
// whose rank files ship inside github.com/pkoukk/tiktoken-go-loader.
//
// Ids produced here are a re-tokenisation, not what an engine sampled: rows
// filled with them must carry token_source "retokenized"
// (export.TokenSourceRetokenized) and never be mixed silently with engine
// ids.
//
// How a tokenizer.json is mapped onto rank-based BPE: every vocabulary entry
// is turned back into its bytes through the GPT-2 byte table, and its id is
// used as its rank. That equals Hugging Face's merge-based BPE when the
// merges, in order, produce tokens of non-decreasing id, which Load checks (true
// of every tiktoken-derived vocabulary: Llama 3, Qwen, GPT-2). Added tokens
// (special or not) are split out of the text first, leftmost-longest, as
// Hugging Face does; the normalizer (NFC, NFKC, NFD, NFKD) is then applied to
// the text between them, and the split regex cuts it into pieces for BPE.
// A vocabulary may lack some bytes (SmolLM2's does) when it has no
// unk_token: characters made of them are dropped from each piece, as
// Hugging Face does.
//
// Not supported (Load returns an error wrapping ErrUnsupported): byte-fallback
// and SentencePiece-style models (Llama 2, Mistral v1, Gemma), WordPiece and
// Unigram models, several split regexes in sequence, add_prefix_space, and
// normalizers other than Unicode normal forms. Post-processors are not
// applied: Encode works like add_special_tokens=false (no BOS added), which is
// what chat prompts rendered from a template need. The lstrip/rstrip/
// single_word flags of added tokens are ignored.
package hf

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	"github.com/pkoukk/tiktoken-go"
	"golang.org/x/text/unicode/norm"
)

// ErrUnsupported is wrapped by Load's errors for tokenizer files outside the
// supported family.
var ErrUnsupported = errors.New("hf: unsupported tokenizer")

// ErrUnknownID is wrapped by Decode's error for an id outside the vocabulary.
var ErrUnknownID = errors.New("hf: unknown token id")

// GPT2Pattern is the split regex of GPT-2's ByteLevel pre-tokenizer
// (use_regex: true).
const GPT2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// Tokenizer encodes and decodes text with one vocabulary. It is safe for
// concurrent use.
type Tokenizer struct {
	core      *tiktoken.Tiktoken
	normalize func(string) string
	added     *regexp.Regexp // leftmost-longest over the added tokens; nil when none
	addedIDs  map[string]uint32
	special   map[uint32]bool
	dec       []string // id -> bytes ("" = unknown id)
	pattern   string
	// missing marks the bytes without a token (nil when none); split is
	// then the pre-tokenizer's regex, to drop them piece by piece.
	missing *[256]bool
	split   *regexp2.Regexp
}

// LoadFile reads (ReadFile: a regular file of at most MaxFileBytes) and
// loads a tokenizer.json file.
func LoadFile(path string) (*Tokenizer, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("hf: %w", err)
	}
	t, err := Load(data)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	return t, nil
}

type fileJSON struct {
	AddedTokens []struct {
		ID      *int64 `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer   json.RawMessage `json:"normalizer"`
	PreTokenizer json.RawMessage `json:"pre_tokenizer"`
	Decoder      json.RawMessage `json:"decoder"`
	Model        struct {
		Type                    string            `json:"type"`
		Vocab                   map[string]int64  `json:"vocab"`
		Merges                  []json.RawMessage `json:"merges"`
		ByteFallback            bool              `json:"byte_fallback"`
		UnkToken                *string           `json:"unk_token"`
		ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	} `json:"model"`
}

// component is a normalizer, pre-tokenizer or decoder object.
type component struct {
	Type           string          `json:"type"`
	Normalizers    json.RawMessage `json:"normalizers"`
	Pretokenizers  json.RawMessage `json:"pretokenizers"`
	Decoders       json.RawMessage `json:"decoders"`
	Pattern        json.RawMessage `json:"pattern"`
	Behavior       string          `json:"behavior"`
	Invert         bool            `json:"invert"`
	AddPrefixSpace bool            `json:"add_prefix_space"`
	UseRegex       *bool           `json:"use_regex"`
}

// maxID bounds token ids, so a hostile file cannot make Load allocate a huge
// decode table.
const maxID = 1 << 24

// Load parses a tokenizer.json (its bytes).
func Load(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("hf: parsing tokenizer.json: %w", err)
	}
	m := &f.Model
	switch {
	case m.Type != "" && m.Type != "BPE":
		return nil, fmt.Errorf("%w: model type %q (only byte-level BPE)", ErrUnsupported, m.Type)
	case len(m.Vocab) == 0:
		return nil, errors.New("hf: tokenizer.json has no model.vocab")
	case m.ByteFallback:
		return nil, fmt.Errorf("%w: byte_fallback BPE (SentencePiece style)", ErrUnsupported)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "",
		m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, fmt.Errorf("%w: subword prefix or end-of-word suffix", ErrUnsupported)
	}
	normalize, err := normalizer(f.Normalizer)
	if err != nil {
		return nil, err
	}
	pattern, err := preTokenizer(f.PreTokenizer)
	if err != nil {
		return nil, err
	}
	if err := checkDecoder(f.Decoder); err != nil {
		return nil, err
	}

	ranks := make(map[string]int, len(m.Vocab))
	maxSeen := int64(-1)
	for tok, id := range m.Vocab {
		if id < 0 || id >= maxID {
			return nil, fmt.Errorf("hf: vocab id %d of %q out of range", id, tok)
		}
		b, ok := unByteLevel(tok)
		if !ok {
			return nil, fmt.Errorf("%w: vocab entry %q is not byte-level", ErrUnsupported, tok)
		}
		if _, dup := ranks[b]; dup {
			return nil, fmt.Errorf("hf: two vocab entries decode to the bytes of %q", tok)
		}
		ranks[b] = int(id)
		maxSeen = max(maxSeen, id)
	}
	// A vocabulary may lack a few bytes (SmolLM2's: six control characters
	// and lead bytes of unassigned planes); Hugging Face's BPE, without
	// unk_token or byte fallback, then drops them from the text.
	var missing [256]bool
	anyMissing := false
	for i := range 256 {
		if _, ok := ranks[string([]byte{byte(i)})]; !ok {
			if m.UnkToken != nil && *m.UnkToken != "" {
				return nil, fmt.Errorf("%w: no token for byte 0x%02x and an unk_token", ErrUnsupported, i)
			}
			missing[i], anyMissing = true, true
		}
	}
	if err := checkMerges(m.Merges, m.Vocab); err != nil {
		return nil, err
	}

	added := map[string]int{}
	t := &Tokenizer{normalize: normalize, pattern: pattern, addedIDs: map[string]uint32{}, special: map[uint32]bool{}}
	if anyMissing {
		t.missing = &missing
		if t.split, err = regexp2.Compile(pattern, regexp2.None); err != nil {
			return nil, fmt.Errorf("hf: split regex %q: %w", pattern, err)
		}
	}
	for _, a := range f.AddedTokens {
		if a.ID == nil || *a.ID < 0 || *a.ID >= maxID || a.Content == "" {
			return nil, fmt.Errorf("hf: added token %q without a valid id", a.Content)
		}
		if _, dup := added[a.Content]; dup {
			return nil, fmt.Errorf("hf: added token %q listed twice", a.Content)
		}
		added[a.Content] = int(*a.ID)
		t.addedIDs[a.Content] = uint32(*a.ID)
		if a.Special {
			t.special[uint32(*a.ID)] = true
		}
		maxSeen = max(maxSeen, *a.ID)
	}
	return t.build(ranks, added, int(maxSeen))
}

// build finishes a Tokenizer from byte ranks and added tokens.
func (t *Tokenizer) build(ranks, added map[string]int, maxSeen int) (*Tokenizer, error) {
	if t.addedIDs == nil {
		t.addedIDs = map[string]uint32{}
		for s, id := range added {
			t.addedIDs[s] = uint32(id)
		}
	}
	if t.special == nil {
		t.special = map[uint32]bool{}
	}
	// tiktoken-go's own special-token handling is bypassed (Encode splits
	// added tokens itself), so it gets none.
	bpe, err := tiktoken.NewCoreBPE(ranks, map[string]int{}, t.pattern)
	if err != nil {
		return nil, fmt.Errorf("hf: building BPE (split regex %q): %w", t.pattern, err)
	}
	t.core = tiktoken.NewTiktoken(bpe, &tiktoken.Encoding{PatStr: t.pattern, MergeableRanks: ranks}, map[string]any{})
	t.dec = make([]string, maxSeen+1)
	for b, id := range ranks {
		t.dec[id] = b
	}
	if len(added) > 0 {
		alts := make([]string, 0, len(added))
		for s, id := range added {
			alts = append(alts, regexp.QuoteMeta(s))
			if t.dec[id] == "" {
				t.dec[id] = s
			}
		}
		slices.Sort(alts)
		re, err := regexp.Compile(strings.Join(alts, "|"))
		if err != nil {
			return nil, fmt.Errorf("hf: added tokens: %w", err)
		}
		re.Longest()
		t.added = re
	}
	return t, nil
}

// Encode returns the ids of text: added tokens are recognised anywhere, no
// BOS or other post-processing is added. Invalid UTF-8 in text is encoded as
// U+FFFD (text from JSON is always valid).
func (t *Tokenizer) Encode(text string) []uint32 {
	var out []uint32
	if t.added == nil {
		return t.appendOrdinary(out, text)
	}
	for len(text) > 0 {
		loc := t.added.FindStringIndex(text)
		if loc == nil {
			return t.appendOrdinary(out, text)
		}
		out = t.appendOrdinary(out, text[:loc[0]])
		out = append(out, t.addedIDs[text[loc[0]:loc[1]]])
		text = text[loc[1]:]
	}
	return out
}

func (t *Tokenizer) appendOrdinary(dst []uint32, s string) []uint32 {
	if s == "" {
		return dst
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if t.normalize != nil {
		s = t.normalize(s)
	}
	if t.missing != nil && strings.ContainsFunc(s, t.unencodable) {
		return t.appendDropping(dst, s)
	}
	for _, id := range t.core.EncodeOrdinary(s) {
		dst = append(dst, uint32(id))
	}
	return dst
}

// unencodable says that r's UTF-8 bytes include one without a token.
func (t *Tokenizer) unencodable(r rune) bool {
	var b [utf8.UTFMax]byte
	for _, c := range b[:utf8.EncodeRune(b[:], r)] {
		if t.missing[c] {
			return true
		}
	}
	return false
}

// appendDropping encodes s, which holds characters with bytes the
// vocabulary lacks, as Hugging Face does: s is split by the pre-tokenizer's
// regex with those characters in place, then they are dropped from each
// piece before BPE. (Hugging Face drops only the missing bytes: for the
// lead byte of a character of planes 4 to 11, unassigned, it keeps the
// continuation bytes, which are dropped here with it.)
func (t *Tokenizer) appendDropping(dst []uint32, s string) []uint32 {
	m, err := t.split.FindStringMatch(s)
	for ; err == nil && m != nil; m, err = t.split.FindNextMatch(m) {
		piece := strings.Map(func(r rune) rune {
			if t.unencodable(r) {
				return -1
			}
			return r
		}, m.String())
		if piece == "" {
			continue
		}
		for _, id := range t.core.EncodeOrdinary(piece) {
			dst = append(dst, uint32(id))
		}
	}
	return dst
}

// DecodeBytes returns the bytes of ids concatenated (special tokens as their
// text). An id outside the vocabulary is an error wrapping ErrUnknownID.
func (t *Tokenizer) DecodeBytes(ids []uint32) ([]byte, error) {
	var out []byte
	for i, id := range ids {
		if int(id) >= len(t.dec) || t.dec[id] == "" {
			return nil, fmt.Errorf("%w: %d (position %d)", ErrUnknownID, id, i)
		}
		out = append(out, t.dec[id]...)
	}
	return out, nil
}

// Decode is DecodeBytes as a string. The string may hold invalid UTF-8 when
// ids cut a character (a stream's chunk boundary); compare bytes, do not
// re-encode it.
func (t *Tokenizer) Decode(ids []uint32) (string, error) {
	b, err := t.DecodeBytes(ids)
	return string(b), err
}

// Normalize applies the tokenizer's normalizer (identity when it has none):
// decoded text equals Normalize of the encoded text, not the text itself.
func (t *Tokenizer) Normalize(s string) string {
	if t.normalize == nil {
		return s
	}
	return t.normalize(s)
}

// IsSpecial reports whether id is an added token marked special (the
// template and role tokens; usable as tokenize.TurnOptions.Special).
func (t *Tokenizer) IsSpecial(id uint32) bool { return t.special[id] }

// AddedID returns the id of an added token (special or not) by its text.
func (t *Tokenizer) AddedID(content string) (uint32, bool) {
	id, ok := t.addedIDs[content]
	return id, ok
}

// VocabSize is one more than the largest id.
func (t *Tokenizer) VocabSize() int { return len(t.dec) }

// Pattern is the split regex in use.
func (t *Tokenizer) Pattern() string { return t.pattern }

// normalizer maps a normalizer object to a function (nil for none).
func normalizer(raw json.RawMessage) (func(string) string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("hf: normalizer: %w", err)
	}
	forms := map[string]norm.Form{"NFC": norm.NFC, "NFKC": norm.NFKC, "NFD": norm.NFD, "NFKD": norm.NFKD}
	if f, ok := forms[c.Type]; ok {
		return f.String, nil
	}
	if c.Type != "Sequence" {
		return nil, fmt.Errorf("%w: normalizer %q", ErrUnsupported, c.Type)
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(c.Normalizers, &parts); err != nil {
		return nil, fmt.Errorf("hf: normalizer sequence: %w", err)
	}
	var fns []func(string) string
	for _, p := range parts {
		fn, err := normalizer(p)
		if err != nil {
			return nil, err
		}
		if fn != nil {
			fns = append(fns, fn)
		}
	}
	if len(fns) == 0 {
		return nil, nil
	}
	return func(s string) string {
		for _, fn := range fns {
			s = fn(s)
		}
		return s
	}, nil
}

// preTokenizer returns the split regex of a supported pre-tokenizer:
// ByteLevel with use_regex (GPT-2's regex), or Split(Regex, Isolated)
// followed by ByteLevel without regex.
func preTokenizer(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", fmt.Errorf("%w: no pre_tokenizer (byte-level BPE needs one)", ErrUnsupported)
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return "", fmt.Errorf("hf: pre_tokenizer: %w", err)
	}
	steps := []component{c}
	if c.Type == "Sequence" {
		var parts []component
		if err := json.Unmarshal(c.Pretokenizers, &parts); err != nil {
			return "", fmt.Errorf("hf: pre_tokenizer sequence: %w", err)
		}
		steps = parts
	}
	pattern, byteLevel := "", false
	for _, s := range steps {
		switch s.Type {
		case "ByteLevel":
			if byteLevel {
				return "", fmt.Errorf("%w: two ByteLevel pre-tokenizers", ErrUnsupported)
			}
			byteLevel = true
			if s.AddPrefixSpace {
				return "", fmt.Errorf("%w: ByteLevel add_prefix_space", ErrUnsupported)
			}
			if s.UseRegex == nil || *s.UseRegex {
				if pattern != "" {
					return "", fmt.Errorf("%w: a Split and ByteLevel's own regex", ErrUnsupported)
				}
				pattern = GPT2Pattern
			}
		case "Split":
			if pattern != "" || byteLevel {
				return "", fmt.Errorf("%w: more than one split regex, or Split after ByteLevel", ErrUnsupported)
			}
			var p struct {
				Regex  *string
				String *string
			}
			if err := json.Unmarshal(s.Pattern, &p); err != nil {
				return "", fmt.Errorf("hf: Split pattern: %w", err)
			}
			switch {
			case p.Regex != nil && *p.Regex != "":
				pattern = *p.Regex
			case p.String != nil && *p.String != "":
				pattern = regexp.QuoteMeta(*p.String)
			default:
				return "", errors.New("hf: Split without a pattern")
			}
			if !strings.EqualFold(s.Behavior, "Isolated") || s.Invert {
				return "", fmt.Errorf("%w: Split behavior %q invert %v (only Isolated)", ErrUnsupported, s.Behavior, s.Invert)
			}
		default:
			return "", fmt.Errorf("%w: pre-tokenizer %q", ErrUnsupported, s.Type)
		}
	}
	if !byteLevel {
		return "", fmt.Errorf("%w: not a byte-level pre-tokenizer", ErrUnsupported)
	}
	if pattern == "" {
		return "", fmt.Errorf("%w: ByteLevel without any split regex", ErrUnsupported)
	}
	return pattern, nil
}

// checkDecoder accepts ByteLevel (alone or as the only step of a Sequence)
// and a missing decoder.
func checkDecoder(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("hf: decoder: %w", err)
	}
	switch c.Type {
	case "ByteLevel":
		return nil
	case "Sequence":
		var parts []json.RawMessage
		if err := json.Unmarshal(c.Decoders, &parts); err != nil {
			return fmt.Errorf("hf: decoder sequence: %w", err)
		}
		for _, p := range parts {
			if err := checkDecoder(p); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("%w: decoder %q", ErrUnsupported, c.Type)
}

// checkMerges verifies that merge i produces a token whose id never
// decreases with i, so that ids can serve as BPE ranks (Llama 3 lists several
// merges producing the same token, consecutively). Merges are "a b" strings or [a, b]
// pairs.
func checkMerges(merges []json.RawMessage, vocab map[string]int64) error {
	last := int64(-1)
	for i, raw := range merges {
		var a, b string
		var pair []string
		if err := json.Unmarshal(raw, &pair); err == nil && len(pair) == 2 {
			a, b = pair[0], pair[1]
		} else {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return fmt.Errorf("hf: merge %d: %s is neither \"a b\" nor [a, b]", i, raw)
			}
			var ok bool
			if a, b, ok = strings.Cut(s, " "); !ok {
				return fmt.Errorf("hf: merge %d: %q has no space", i, s)
			}
		}
		_, okA := vocab[a]
		_, okB := vocab[b]
		id, okAB := vocab[a+b]
		if !okA || !okB || !okAB {
			return fmt.Errorf("hf: merge %d (%q + %q): a part or the result is not in the vocab", i, a, b)
		}
		if id < last {
			return fmt.Errorf("%w: merge %d (%q + %q) gives id %d after id %d: merge order does not follow ids",
				ErrUnsupported, i, a, b, id, last)
		}
		last = id
	}
	return nil
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}
