package mock

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/tokenize/chattemplate"
)

// vocabulary is the tokenizer and chat template a server renders, encodes
// and decodes with: the toy one (tokenizer.go, template.go), or a real
// model's (Config.ModelDir: its tokenizer.json and chat template through
// tokenize/chattemplate).
type vocabulary struct {
	pieces []string // id -> the token's bytes
	eot    uint32   // the end-of-turn token an answer that stops on its own ends with
	// skip[id]: the token adds no text to an answer (vLLM detokenizes with
	// skip_special_tokens; the toy skips only its end-of-turn token).
	skip []bool
	real *realModel // nil: the toy
}

// realModel is what real-template mode knows of its model.
type realModel struct {
	rt *chattemplate.Retokenizer
	// llama3JSON: tool calls are written and parsed as vLLM's llama3_json
	// parser reads them ({"name": …, "parameters": …}); else as hermes
	// (<tool_call>{"name": …, "arguments": …}</tool_call>, Qwen).
	llama3JSON bool
	// thinking: the template knows enable_thinking (Qwen3): an answer opens
	// with a <think> block unless the prompt closed one (enable_thinking
	// false), and vLLM's qwen3 reasoning parser reads it.
	thinking bool
}

// toy is the toy vocabulary (set by tokenizer.go's init, once vocab is built).
var toy *vocabulary

func newToy() *vocabulary {
	v := &vocabulary{pieces: vocab, eot: TokenIMEnd, skip: make([]bool, len(vocab))}
	v.skip[TokenIMEnd] = true
	return v
}

// loadVocabulary loads a real model's tokenizer and chat template from dir
// (tokenizer.json and tokenizer_config.json, chattemplate.LoadDir). The
// end-of-turn token is the special token the template writes first after an
// assistant message's content (<|im_end|> for Qwen, <|eot_id|> for Llama 3).
func loadVocabulary(dir string) (*vocabulary, error) {
	rt, err := chattemplate.LoadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("mock: --model-dir: %w", err)
	}
	tok := rt.Tokenizer
	v := &vocabulary{pieces: make([]string, tok.VocabSize()), skip: make([]bool, tok.VocabSize()), real: &realModel{rt: rt}}
	for id := range v.pieces {
		b, err := tok.DecodeBytes([]uint32{uint32(id)})
		if err == nil {
			v.pieces[id] = string(b)
		}
		v.skip[id] = tok.IsSpecial(uint32(id))
	}
	turn, err := rt.Template.Render(chattemplate.Input{Messages: []byte(`[{"role":"user","content":"x"},{"role":"assistant","content":"y"}]`)})
	if err != nil {
		return nil, fmt.Errorf("mock: --model-dir %s: rendering an assistant turn: %w", dir, err)
	}
	ids := tok.Encode(turn[strings.LastIndex(turn, "y")+1:])
	found := false
	for _, id := range ids {
		if tok.IsSpecial(id) {
			v.eot, found = id, true
			break
		}
	}
	if !found {
		return nil, errors.New("mock: --model-dir " + dir + ": the chat template writes no special token after an assistant message (no end-of-turn token)")
	}
	_, hermes := tok.AddedID("<tool_call>")
	v.real.llama3JSON = !hermes
	probe, err := rt.Template.Render(chattemplate.Input{Messages: []byte(`[{"role":"user","content":"x"}]`), AddGenerationPrompt: true, Kwargs: []byte(`{"enable_thinking":false}`)})
	v.real.thinking = err == nil && strings.HasSuffix(probe, "</think>\n\n")
	return v, nil
}

// size is the number of token ids (valid ids are 0..size()-1).
func (v *vocabulary) size() int { return len(v.pieces) }

// text is what token id adds to an answer's text.
func (v *vocabulary) text(id uint32) string {
	if int(id) >= len(v.pieces) || v.skip[id] {
		return ""
	}
	return v.pieces[id]
}

// validUTF8 reports whether token id decodes to valid UTF-8 on its own.
func (v *vocabulary) validUTF8(id uint32) bool {
	return int(id) < len(v.pieces) && utf8.ValidString(v.pieces[id])
}

// encode appends the ids of text (special tokens recognised in it).
func (v *vocabulary) encode(dst []uint32, text string) []uint32 {
	if v.real == nil {
		return appendEncode(dst, text)
	}
	return append(dst, v.real.rt.Tokenizer.Encode(text)...)
}

// decode appends the bytes of ids (unknown ids add nothing).
func (v *vocabulary) decode(dst []byte, ids []uint32) []byte {
	for _, id := range ids {
		if int(id) < len(v.pieces) {
			dst = append(dst, v.pieces[id]...)
		}
	}
	return dst
}

// renderChat appends the chat prompt of a request's messages, tools and
// chat_template_kwargs; msg is a 400 message when the template cannot
// render them (real templates raise on what they do not know).
func (v *vocabulary) renderChat(dst []byte, f *fields) (_ []byte, msg string) {
	if v.real == nil {
		return appendRenderChat(dst, f.messages.Raw, f.tools.Raw, f.addGenPrompt), ""
	}
	if k := f.kwargs; k.Exists() && k.Type != gjson.Null && !k.IsObject() {
		return dst, "chat_template_kwargs: Input should be a valid dictionary"
	}
	out, err := v.real.rt.Template.Render(chattemplate.Input{Messages: []byte(f.messages.Raw), Tools: []byte(f.tools.Raw), Kwargs: []byte(f.kwargs.Raw), AddGenerationPrompt: f.addGenPrompt})
	if err != nil {
		return dst, "the chat template cannot render the request: " + err.Error()
	}
	return append(dst, out...), ""
}

// appendTokenBytes appends the UTF-8 bytes of token id as a JSON list (U+FFFD's for a
// token that is not valid UTF-8 on its own).
func (v *vocabulary) appendTokenBytes(dst []byte, id uint32) []byte {
	tok := v.pieces[id]
	if !v.validUTF8(id) {
		tok = "\ufffd"
	}
	return appendRawBytes(dst, tok)
}

// appendText appends the escaped text of ids (no quotes). Generated tokens are ASCII, so
// escaping token by token is exact. Skipped tokens (the end-of-turn token) are no text.
func (v *vocabulary) appendText(dst []byte, ids []uint32) []byte {
	for _, id := range ids {
		dst = appendJSONStringBody(dst, v.text(id))
	}
	return dst
}

// decodeText appends the answer text of ids: their text without the
// skipped tokens.
func (v *vocabulary) decodeText(dst []byte, ids []uint32) []byte {
	for _, id := range ids {
		dst = append(dst, v.text(id)...)
	}
	return dst
}
