package chattemplate

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/rollgate/rollgate/tokenize/hf"
)

// ErrNotRetokenizable is wrapped by Retokenize's errors for calls whose ids
// cannot be rebuilt faithfully (another endpoint, a request with its own
// template, non-text content, a template that renders the assistant turn
// without its own generation prompt in front).
var ErrNotRetokenizable = errors.New("chattemplate: call cannot be retokenized")

// Retokenizer rebuilds the token ids of chat calls captured without them,
// from the model's chat template and tokenizer. Its ids are a
// re-tokenisation: rows and samples built from them carry token_source
// "retokenized" and must never be mixed silently with engine ids. It is safe
// for concurrent use.
type Retokenizer struct {
	Template  *Template
	Tokenizer *hf.Tokenizer
}

// LoadDir loads dir/tokenizer.json (package hf) and the chat template of the
// Hugging Face model folder dir (LoadModelDir: chat_template.jinja,
// chat_template.json or tokenizer_config.json).
func LoadDir(dir string) (*Retokenizer, error) {
	tok, err := hf.LoadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("chattemplate: loading the tokenizer of %s: %w", dir, err)
	}
	tpl, err := LoadModelDir(dir)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: loading the chat template of %s: %w", dir, err)
	}
	return &Retokenizer{Template: tpl, Tokenizer: tok}, nil
}

// Retokenized is what Retokenize rebuilds for one call choice.
type Retokenized struct {
	PromptText, ResponseText string
	PromptIDs, ResponseIDs   []uint32
}

// Retokenize rebuilds the prompt and response ids of one choice of a
// /v1/chat/completions call from its request body, the choice's assistant
// message (response_message) and finish reason.
//
// Prompt: the template rendered over the request's messages, tools and
// chat_template_kwargs with add_generation_prompt (the request's value,
// default true), encoded with special tokens recognised in the text and no
// BOS added (templates that want one write bos_token themselves), as vLLM
// and SGLang encode chat prompts.
//
// Response: what an engine samples after that prompt. The template is
// rendered again over the messages followed by the assistant message,
// without a generation prompt; the response is the part after the prompt
// text, encoded on its own (sampled ids never merge with the prompt's). It
// ends with the template's end-of-turn token (<|im_end|>, <|eot_id|>), which
// engines sample and return; the separator the template writes after that
// token (the "\n" between turns) is dropped, as engines stop at the token.
// When finish_reason is "length" the end-of-turn token is dropped too: the
// engine was cut before sampling it. A template whose full rendering does
// not start with the prompt (it renders the last assistant turn differently
// from how it opens it) gives an error wrapping ErrNotRetokenizable.
func (r *Retokenizer) Retokenize(requestBody, responseMessage, finishReason string) (*Retokenized, error) {
	req := gjson.Parse(requestBody)
	if !req.IsObject() {
		return nil, fmt.Errorf("%w: request body is not a JSON object", ErrNotRetokenizable)
	}
	msgs := req.Get("messages")
	if !msgs.IsArray() {
		return nil, fmt.Errorf("%w: request has no messages array (only chat completions are retokenized)", ErrNotRetokenizable)
	}
	if req.Get("chat_template").Exists() {
		return nil, fmt.Errorf("%w: the request carries its own chat_template", ErrNotRetokenizable)
	}
	if req.Get("continue_final_message").Bool() {
		return nil, fmt.Errorf("%w: continue_final_message is not supported", ErrNotRetokenizable)
	}
	addGen := true
	if g := req.Get("add_generation_prompt"); g.Exists() {
		addGen = g.Bool()
	}
	in := Input{Messages: []byte(msgs.Raw), Tools: []byte(req.Get("tools").Raw), Kwargs: []byte(req.Get("chat_template_kwargs").Raw), AddGenerationPrompt: addGen}
	prompt, err := r.Template.Render(in)
	if err != nil {
		return nil, fmt.Errorf("%w: prompt: %w", ErrNotRetokenizable, err)
	}
	msg := gjson.Parse(responseMessage)
	if !msg.IsObject() {
		return nil, fmt.Errorf("%w: response message is not a JSON object", ErrNotRetokenizable)
	}
	if msg.Get("role").String() == "" {
		if responseMessage, err = sjson.Set(responseMessage, "role", "assistant"); err != nil {
			return nil, fmt.Errorf("%w: response message: %w", ErrNotRetokenizable, err)
		}
	}
	all, err := sjson.SetRaw(msgs.Raw, "-1", responseMessage)
	if err != nil {
		return nil, fmt.Errorf("%w: appending the response message: %w", ErrNotRetokenizable, err)
	}
	in.Messages, in.AddGenerationPrompt = []byte(all), false
	full, err := r.Template.Render(in)
	if err != nil {
		return nil, fmt.Errorf("%w: assistant turn: %w", ErrNotRetokenizable, err)
	}
	if !strings.HasPrefix(full, prompt) {
		return nil, fmt.Errorf("%w: the template renders the assistant turn without the generation prompt in front", ErrNotRetokenizable)
	}
	out := &Retokenized{PromptText: prompt, PromptIDs: r.Tokenizer.Encode(prompt)}
	ids := r.Tokenizer.Encode(full[len(prompt):])
	end := -1 // the last special token
	for i := len(ids) - 1; i >= 0; i-- {
		if r.Tokenizer.IsSpecial(ids[i]) {
			end = i
			break
		}
	}
	if end >= 0 {
		if tail, err := r.Tokenizer.Decode(ids[end+1:]); err == nil && strings.TrimSpace(tail) == "" {
			ids = ids[:end+1]
		}
		if finishReason == "length" && end == len(ids)-1 {
			ids = ids[:end]
		}
	}
	out.ResponseIDs = ids
	if out.ResponseText, err = r.Tokenizer.Decode(ids); err != nil {
		return nil, fmt.Errorf("chattemplate: decoding the response: %w", err)
	}
	return out, nil
}
