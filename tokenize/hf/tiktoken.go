package hf

import (
	"fmt"
	"strings"

	loader "github.com/pkoukk/tiktoken-go-loader"
)

// Names of the tiktoken vocabularies whose rank files ship embedded in
// github.com/pkoukk/tiktoken-go-loader (no network access).
const (
	CL100K = "cl100k_base"
	O200K  = "o200k_base"
)

var tiktokenDefs = map[string]struct {
	pattern string
	special map[string]int
}{
	CL100K: {
		pattern: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
		special: map[string]int{"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
			"<|fim_suffix|>": 100260, "<|endofprompt|>": 100276},
	},
	O200K: {
		pattern: strings.Join([]string{
			`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
			`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
			`\p{N}{1,3}`,
			` ?[^\s\p{L}\p{N}]+[\r\n/]*`,
			`\s*[\r\n]+`,
			`\s+(?!\S)`,
			`\s+`,
		}, "|"),
		special: map[string]int{"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
	},
}

// Tiktoken returns one of the embedded tiktoken vocabularies (CL100K or
// O200K), with its special tokens.
func Tiktoken(name string) (*Tokenizer, error) {
	def, ok := tiktokenDefs[name]
	if !ok {
		return nil, fmt.Errorf("hf: unknown tiktoken vocabulary %q (have %s, %s)", name, CL100K, O200K)
	}
	ranks, err := loader.NewOfflineLoader().LoadTiktokenBpe(name + ".tiktoken")
	if err != nil {
		return nil, fmt.Errorf("hf: loading %s ranks: %w", name, err)
	}
	maxSeen := 0
	for _, r := range ranks {
		maxSeen = max(maxSeen, r)
	}
	special := map[uint32]bool{}
	for _, id := range def.special {
		maxSeen = max(maxSeen, id)
		special[uint32(id)] = true
	}
	t := &Tokenizer{pattern: def.pattern, special: special}
	return t.build(ranks, def.special, maxSeen)
}

// Ranks returns the byte ranks of an embedded tiktoken vocabulary (for tools
// and tests that convert it).
func Ranks(name string) (map[string]int, error) {
	if _, ok := tiktokenDefs[name]; !ok {
		return nil, fmt.Errorf("hf: unknown tiktoken vocabulary %q", name)
	}
	ranks, err := loader.NewOfflineLoader().LoadTiktokenBpe(name + ".tiktoken")
	if err != nil {
		return nil, fmt.Errorf("hf: loading %s ranks: %w", name, err)
	}
	return ranks, nil
}
