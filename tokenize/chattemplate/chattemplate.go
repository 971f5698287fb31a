// Package chattemplate renders a model's chat template (the Jinja
// "chat_template" of its Hugging Face tokenizer_config.json) over the
// messages of a captured chat request, so prompt ids can be produced the way
// an engine (vLLM, SGLang) produces them when the engine did not return them.
//
// Rendering uses github.com/nikolalohinski/gonja/v2 configured like
// Hugging Face transformers' apply_chat_template: trim_blocks and
// lstrip_blocks, the template's bos_token and eos_token, raise_exception,
// strftime_now, and a tojson filter that writes Python's json.dumps form
// (ensure_ascii=False, ", " and ": " separators, key order kept, no HTML
// escaping) instead of gonja's Go-style JSON.
//
// Messages are prepared as vLLM prepares them before rendering (see
// PrepareMessages): a null or missing content becomes "", a list of text
// parts is joined with "\n", and the JSON-string arguments of assistant tool
// calls are parsed into objects.
//
// Known limits: dict methods (.items(), .keys(), .values()) iterate in
// sorted key order, not insertion order (a gonja behaviour); floats are
// written as Python writes them, so a template fed 1.0 prints "1.0" where
// @huggingface/jinja (JavaScript) prints "1".
package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2"
	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"

	"github.com/rollgate/rollgate/tokenize/hf"
)

func init() {
	// gonja logs template errors through logrus at error level; errors are
	// returned to the caller here, so its own logging is switched off.
	gonja.SetLoggerOutput(io.Discard)
}

// Template is one compiled chat template with its special tokens. It is
// safe for concurrent use.
type Template struct {
	tpl      *exec.Template
	bos, eos string
}

// configJSON is the part of tokenizer_config.json a Template reads.
type configJSON struct {
	ChatTemplate json.RawMessage `json:"chat_template"`
	BOSToken     json.RawMessage `json:"bos_token"`
	EOSToken     json.RawMessage `json:"eos_token"`
}

// LoadConfigFile reads a tokenizer_config.json (hf.ReadFile: a regular
// file of at most hf.MaxFileBytes) and compiles its chat template.
func LoadConfigFile(path string) (*Template, error) {
	data, err := hf.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: %w", err)
	}
	t, err := LoadConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	return t, nil
}

// LoadConfig compiles the chat template of a tokenizer_config.json (its
// bytes). chat_template may be a string or a list of {name, template}, of
// which "default" is used; bos_token and eos_token may be strings, null, or
// objects with a "content" field.
func LoadConfig(data []byte) (*Template, error) {
	return loadConfig(data, nil)
}

// loadConfig is LoadConfig with the template's source taken from source
// when it is not nil (a chat_template.jinja or chat_template.json file).
func loadConfig(data []byte, source json.RawMessage) (*Template, error) {
	var c configJSON
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("chattemplate: parsing tokenizer_config.json: %w", err)
	}
	if source != nil {
		c.ChatTemplate = source
	}
	src, err := templateSource(c.ChatTemplate)
	if err != nil {
		return nil, err
	}
	bos, err := tokenString(c.BOSToken)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: bos_token: %w", err)
	}
	eos, err := tokenString(c.EOSToken)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: eos_token: %w", err)
	}
	return New(src, bos, eos)
}

// LoadModelDir compiles the chat template of a Hugging Face model folder:
// chat_template.jinja when present, else the chat_template of
// chat_template.json, else that of tokenizer_config.json (newer models ship
// the template in its own file); bos_token and eos_token always come from
// tokenizer_config.json. Each file is read with hf.ReadFile (a regular file
// of at most hf.MaxFileBytes); one that exists but is refused is an error.
func LoadModelDir(dir string) (*Template, error) {
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	data, err := hf.ReadFile(cfgPath)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: %w", err)
	}
	var source json.RawMessage
	b, err := readOptional(filepath.Join(dir, "chat_template.jinja"))
	if err != nil {
		return nil, err
	}
	if b != nil {
		source, _ = json.Marshal(string(b))
	} else if b, err = readOptional(filepath.Join(dir, "chat_template.json")); err != nil {
		return nil, err
	} else if b != nil {
		var f struct {
			ChatTemplate json.RawMessage `json:"chat_template"`
		}
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("chattemplate: parsing %s: %w", filepath.Join(dir, "chat_template.json"), err)
		}
		source = f.ChatTemplate
	}
	t, err := loadConfig(data, source)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, dir)
	}
	return t, nil
}

// readOptional reads a file a model folder may lack: nil when it does not
// exist, an error when it exists but cannot be read or is refused.
func readOptional(path string) ([]byte, error) {
	b, err := hf.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("chattemplate: %w", err)
	}
	return b, nil
}

func templateSource(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", errors.New("chattemplate: tokenizer_config.json has no chat_template (pass the model's template file instead)")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("chattemplate: chat_template is neither a string nor a list of {name, template}: %w", err)
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", errors.New(`chattemplate: chat_template lists no template named "default"`)
}

func tokenString(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var o struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", fmt.Errorf("neither a string nor an object with content: %w", err)
	}
	return o.Content, nil
}

func isNull(raw json.RawMessage) bool {
	s := bytes.TrimSpace(raw)
	return len(s) == 0 || string(s) == "null"
}

// environment is gonja's default environment with transformers' globals and
// a Python-compatible tojson. Built once; gonja only reads it.
var environment = func() *exec.Environment {
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
	if err := filters.Replace("tojson", filterToJSON); err != nil {
		panic(err) // gonja always has tojson
	}
	ctx := exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables)
	ctx.Set("raise_exception", raiseException)
	ctx.Set("strftime_now", strftimeNow)
	return &exec.Environment{
		Context:           ctx,
		Filters:           filters,
		Tests:             builtins.Tests,
		ControlStructures: builtins.ControlStructures,
		Methods:           builtins.Methods,
	}
}()

// New compiles a chat template source with its special tokens.
func New(source, bos, eos string) (t *Template, err error) {
	defer func() {
		if r := recover(); r != nil { // gonja's parser may panic on hostile input
			t, err = nil, fmt.Errorf("chattemplate: compiling the template: %v", r)
		}
	}()
	cfg := config.New()
	cfg.TrimBlocks, cfg.LeftStripBlocks = true, true
	base, err := loaders.NewFileSystemLoader("")
	if err != nil {
		return nil, fmt.Errorf("chattemplate: %w", err)
	}
	const rootID = "chat_template"
	loader, err := loaders.NewShiftedLoader(rootID, strings.NewReader(source), base)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: %w", err)
	}
	tpl, err := exec.NewTemplate(rootID, cfg, loader, environment)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: compiling the template: %w", err)
	}
	return &Template{tpl: tpl, bos: bos, eos: eos}, nil
}

// BOS is the template's bos_token ("" when it has none).
func (t *Template) BOS() string { return t.bos }

// EOS is the template's eos_token ("" when it has none).
func (t *Template) EOS() string { return t.eos }

// Input is what one rendering reads, as JSON taken from a chat request.
type Input struct {
	// Messages is the JSON array of messages, prepared with
	// PrepareMessages unless Raw is set.
	Messages json.RawMessage
	// Tools is the request's tools array (null or empty = none).
	Tools json.RawMessage
	// Kwargs is the request's chat_template_kwargs object: more template
	// variables (e.g. Qwen3's enable_thinking). They may not override
	// messages, tools, add_generation_prompt or the special tokens.
	Kwargs json.RawMessage
	// AddGenerationPrompt appends the opening of the assistant's turn.
	AddGenerationPrompt bool
	// Raw renders Messages as given, without PrepareMessages.
	Raw bool
}

// Render renders the template over in.
func (t *Template) Render(in Input) (out string, err error) {
	msgs := in.Messages
	if !in.Raw {
		if msgs, err = PrepareMessages(msgs); err != nil {
			return "", err
		}
	}
	messages, err := decodeValue(msgs)
	if err != nil {
		return "", fmt.Errorf("chattemplate: messages: %w", err)
	}
	if _, ok := messages.([]any); !ok {
		return "", errors.New("chattemplate: messages is not a JSON array")
	}
	data := map[string]any{}
	if !isNull(in.Kwargs) {
		kw, err := decodeValue(in.Kwargs)
		if err != nil {
			return "", fmt.Errorf("chattemplate: chat_template_kwargs: %w", err)
		}
		d, ok := kw.(*exec.Dict)
		if !ok {
			return "", errors.New("chattemplate: chat_template_kwargs is not a JSON object")
		}
		for _, p := range d.Pairs {
			data[p.Key.String()] = p.Value.Interface()
		}
	}
	data["messages"] = messages
	data["add_generation_prompt"] = in.AddGenerationPrompt
	data["bos_token"], data["eos_token"] = t.bos, t.eos
	data["tools"] = nil
	if !isNull(in.Tools) {
		tools, err := decodeValue(in.Tools)
		if err != nil {
			return "", fmt.Errorf("chattemplate: tools: %w", err)
		}
		if l, ok := tools.([]any); !ok {
			return "", errors.New("chattemplate: tools is not a JSON array")
		} else if len(l) > 0 {
			data["tools"] = l
		}
	}
	defer func() {
		if r := recover(); r != nil { // gonja may panic on unexpected value types
			out, err = "", fmt.Errorf("chattemplate: rendering: %v", r)
		}
	}()
	var b strings.Builder
	if err := t.tpl.Execute(&b, exec.NewContext(data)); err != nil {
		return "", fmt.Errorf("chattemplate: rendering: %w", err)
	}
	return b.String(), nil
}

// raiseException is the raise_exception global of transformers' templates.
func raiseException(_ *exec.Evaluator, params *exec.VarArgs) *exec.Value {
	msg := "raise_exception called"
	if len(params.Args) > 0 {
		msg = params.Args[0].String()
	}
	return exec.AsValue(fmt.Errorf("template error: %s", msg))
}

// strftimeNow is the strftime_now global (Llama 3.1+ templates date their
// system prompt with it); it knows the directives those templates use.
func strftimeNow(_ *exec.Evaluator, params *exec.VarArgs) *exec.Value {
	if len(params.Args) != 1 {
		return exec.AsValue(errors.New("strftime_now takes one format argument"))
	}
	now := time.Now()
	r := strings.NewReplacer("%d", now.Format("02"), "%b", now.Format("Jan"), "%B", now.Format("January"),
		"%Y", now.Format("2006"), "%m", now.Format("01"), "%H", now.Format("15"), "%M", now.Format("04"),
		"%S", now.Format("05"), "%y", now.Format("06"), "%%", "%")
	return exec.AsValue(r.Replace(params.Args[0].String()))
}
