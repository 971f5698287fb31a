package mock

import "unicode/utf8"

// Characters split over byte tokens (Config.SplitChars): every n-th generated word is
// replaced by an emoji that the toy tokenizer encodes as its four UTF-8 bytes, one
// token each, as a byte-level BPE does with a rare character. No token before the
// last one ends on a whole character:
//   - vLLM's incremental detokenizer returns no text for them and the whole character
//     with the last; every token is still in token_ids and logprobs, and a stream
//     sends a chunk per token (text "" for the first three);
//   - llama.cpp (server-context.cpp process_token) does not add a token to the
//     logprobs, nor send it in a stream, while the text ends inside a character: the
//     first three tokens are in no logprobs and no chunk; usage counts them.

// splitChar is the character that SplitChars inserts.
const splitChar = "\U0001F600" // 😀, F0 9F 98 80

// insertSplitChars rewrites c.ids (n generated word ids) so that every k-th position
// holds splitChar's byte tokens, keeping n tokens in all.
func (p *plan) insertSplitChars(c *planChoice) {
	k := p.s.cfg.SplitChars
	if k <= 0 || c.tool || p.s.cfg.Flavor == FlavorSGLang {
		return
	}
	n := len(c.ids)
	words := append([]uint32(nil), c.ids...)
	c.ids = c.ids[:0]
	for j := 0; len(c.ids) < n; j++ {
		if (j+1)%k == 0 && len(c.ids)+len(splitChar) <= n {
			for i := 0; i < len(splitChar); i++ {
				c.ids = append(c.ids, uint32(splitChar[i]))
			}
			continue
		}
		c.ids = append(c.ids, words[j%len(words)])
	}
	// Per-step text: nothing until a character is whole.
	c.stepText = c.stepText[:0]
	c.hidden = c.hidden[:0]
	pending := ""
	for _, id := range c.ids {
		pending += vocab[id]
		whole := utf8.ValidString(pending)
		if !whole {
			c.stepText = append(c.stepText, "")
		} else {
			c.stepText = append(c.stepText, pending)
			pending = ""
		}
		c.hidden = append(c.hidden, !whole && p.s.cfg.Flavor == FlavorLlamaCpp)
	}
}

// hiddenAt reports whether the engine leaves token pos out of logprobs and streams
// (llama.cpp, a token ending inside a character).
func (c *planChoice) hiddenAt(pos int) bool { return c.hidden != nil && c.hidden[pos] }
