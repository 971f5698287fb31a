package mock

import "strings"

// The toy tokenizer has a fixed vocabulary whose ids never change:
//
//   - ids 0..255 are single bytes (the byte fallback, so every input encodes);
//   - ids 256..260 are the special tokens of the chat template (see the Token* constants);
//   - then the template pieces (pieceList), in order;
//   - then the generation words (genWordList, each with a leading space), in order.
//
// Encode is greedy longest match over that vocabulary, so Decode(Encode(s)) == s for every
// byte string s. Never reorder or remove entries: tests elsewhere rely on stable ids.

// Special token ids of the toy tokenizer.
const (
	TokenEndOfText = 256 // "<|endoftext|>"
	TokenIMStart   = 257 // "<|im_start|>"
	TokenIMEnd     = 258 // "<|im_end|>"
	TokenToolCall  = 259 // "<tool_call>"
	TokenToolEnd   = 260 // "</tool_call>"
)

var specialTokens = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"}

// pieceList holds multi-byte pieces used by the chat template and JSON tool calls.
var pieceList = strings.Fields(`system user assistant tool Tools <tools> </tools>
{" ":" "," "} ": name arguments type function parameters properties
description string integer number boolean object array required enum items true false null
Hello Hi The What How Why Please Thanks`)

// genWordList holds the words the mock generates (a leading space is added to each).
var genWordList = strings.Fields(`the of and to in is it that for on with as was at by be this from or
have an are not but what all were when we there can been has more if will one so no would out up
about into them some could time two may then do first any my now such like other over only new
also its after most made many before must through back years where much your way well down should
because each just those people how too little state good very make world still own see men work long
get here between both life being under never day same another know while last might us great old
year off come since against go came right used take three alpha beta gamma delta omega quick brown
fox jumps lazy dog river stone cloud light dark green blue red yellow orange purple silver gold
iron copper water fire earth wind north south east west city town road bridge tower garden forest
mountain valley ocean island desert field house door window table chair book paper letter number
answer question reason result model token train reward policy value gradient batch sample trace
rollout step epoch loss signal vector matrix engine server client request response stream chunk
cache memory queue worker thread socket packet header record column simple happy calm bright
quiet rapid gentle bold clever eager fair kind proud brave wise`)

// genWords are the token ids the generator samples from (contiguous, see genBase).
var (
	vocab    []string // id -> token bytes
	genBase  uint32   // first id of the generation words
	genWords []uint32 // ids of the generation words
	root     trieNode
)

type trieEdge struct {
	b    byte
	node *trieNode
}

type trieNode struct {
	edges []trieEdge
	id    int32 // -1 when no token ends here
}

func (n *trieNode) child(b byte) *trieNode {
	for i := range n.edges {
		if n.edges[i].b == b {
			return n.edges[i].node
		}
	}
	return nil
}

func init() {
	vocab = make([]string, 0, 256+len(specialTokens)+len(pieceList)+len(genWordList))
	for i := 0; i < 256; i++ {
		vocab = append(vocab, string([]byte{byte(i)}))
	}
	vocab = append(vocab, specialTokens...)
	vocab = append(vocab, pieceList...)
	genBase = uint32(len(vocab))
	for _, w := range genWordList {
		genWords = append(genWords, uint32(len(vocab)))
		vocab = append(vocab, " "+w)
	}
	root.id = -1
	seen := make(map[string]bool, len(vocab))
	for id := 256; id < len(vocab); id++ {
		tok := vocab[id]
		if seen[tok] || len(tok) < 2 {
			panic("mock: duplicate or single-byte vocabulary entry " + tok)
		}
		seen[tok] = true
		n := &root
		for i := 0; i < len(tok); i++ {
			c := n.child(tok[i])
			if c == nil {
				c = &trieNode{id: -1}
				n.edges = append(n.edges, trieEdge{b: tok[i], node: c})
			}
			n = c
		}
		n.id = int32(id)
	}
	toy = newToy()
}

// VocabSize is the number of token ids of the toy tokenizer (valid ids are 0..VocabSize()-1).
func VocabSize() int { return len(vocab) }

// TokenString returns the bytes of token id as a string, or "" when id is out of range.
func TokenString(id uint32) string {
	if int(id) >= len(vocab) {
		return ""
	}
	return vocab[id]
}

// Encode tokenizes text with the toy tokenizer: greedy longest match over the fixed
// vocabulary with a byte fallback. Decode(Encode(s)) == s for every s.
func Encode(text string) []uint32 {
	return appendEncode(nil, text)
}

// appendEncode appends the ids of text to dst.
func appendEncode(dst []uint32, text string) []uint32 {
	return appendEncodeSpecial(dst, text, true)
}

// appendEncodeSpecial appends the ids of text to dst; with special false the special
// tokens are not matched, so their text encodes as ordinary pieces and bytes (llama.cpp's
// parse_special: false).
func appendEncodeSpecial(dst []uint32, text string, special bool) []uint32 {
	for i := 0; i < len(text); {
		best, bestLen := uint32(text[i]), 1
		n := &root
		for j := i; j < len(text); j++ {
			n = n.child(text[j])
			if n == nil {
				break
			}
			if n.id >= 0 && (special || !isSpecial(uint32(n.id))) {
				best, bestLen = uint32(n.id), j-i+1
			}
		}
		dst = append(dst, best)
		i += bestLen
	}
	return dst
}

// isSpecial reports whether id is one of the special tokens (TokenEndOfText..TokenToolEnd).
func isSpecial(id uint32) bool {
	return id >= TokenEndOfText && id < TokenEndOfText+uint32(len(specialTokens))
}

// Decode returns the text of ids; ids out of range decode to "".
func Decode(ids []uint32) string {
	return string(appendDecode(nil, ids))
}

func appendDecode(dst []byte, ids []uint32) []byte {
	for _, id := range ids {
		if int(id) < len(vocab) {
			dst = append(dst, vocab[id]...)
		}
	}
	return dst
}
