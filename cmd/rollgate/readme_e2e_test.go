package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rollgate/rollgate/testkit/gatewaytest"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// The README's walk-throughs, run as written: the commands are read out of
// README.md's fenced blocks under a heading (never copied here), so the test
// fails when the README and the binary drift apart. The only changes made to
// them: the addresses they name are replaced by free loopback ports (other
// tests and gateways run on this machine), and a server the README runs in the
// foreground is run in the background. PyPI must be reachable (pip installs
// the README's packages; python/requirements/package-constraints.txt pins their
// versions through PIP_CONSTRAINT).

// readmeSection returns README.md from the line that starts with heading up to
// the next "## " heading.
func readmeSection(t *testing.T, heading string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n"+heading)
	if i < 0 {
		t.Fatalf("README.md has no heading %q: the test reads its commands from there (renamed? update the test)", heading)
	}
	s = s[i+1:]
	if j := strings.Index(s[len(heading):], "\n## "); j >= 0 {
		s = s[:len(heading)+j]
	}
	return s
}

// fencedBlock is one ``` block of the README: its info string and its text.
type fencedBlock struct{ lang, text string }

func fencedBlocks(section string) []fencedBlock {
	var out []fencedBlock
	var cur *fencedBlock
	for _, line := range strings.Split(section, "\n") {
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &fencedBlock{lang: strings.TrimSpace(strings.TrimPrefix(line, "```"))}
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	return out
}

// shellCommands splits a sh block into the commands a reader types: lines
// joined where one ends with a backslash; blank and comment-only lines dropped.
func shellCommands(text string) []string {
	var cmds []string
	cur := ""
	for _, line := range strings.Split(text, "\n") {
		if cur == "" && (strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#")) {
			continue
		}
		cur += line
		if strings.HasSuffix(line, `\`) {
			cur += "\n"
			continue
		}
		cmds = append(cmds, cur)
		cur = ""
	}
	if cur != "" {
		cmds = append(cmds, cur)
	}
	return cmds
}

// shellSession is one bash reading commands one at a time, as a terminal
// would: variables, the working folder, an activated venv and background jobs
// carry over from one command to the next. After each command the session
// prints a marker line with its exit status; its output is what the session
// printed before that line.
type shellSession struct {
	t      *testing.T
	stdin  io.WriteCloser
	out    *syncBuffer
	exited chan struct{}
	n      int
}

func newShellSession(t *testing.T, dir string, env []string) *shellSession {
	t.Helper()
	cmd := exec.Command("bash", "--noprofile", "--norc", "-s")
	cmd.Dir, cmd.Env = dir, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		// The session and what it left running in the background (servers).
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		stdin.Close()
		<-exited
		if t.Failed() {
			t.Logf("the session's whole output:\n%s", out.String())
		}
	})
	return &shellSession{t: t, stdin: stdin, out: out, exited: exited}
}

// run types one command and returns its exit status and output.
func (s *shellSession) run(command string, timeout time.Duration) (int, string) {
	s.t.Helper()
	s.n++
	before := len(s.out.String())
	marker := fmt.Sprintf("\n__readme_command_%d_exit ", s.n)
	if _, err := fmt.Fprintf(s.stdin, "%s\necho; echo \"%s$?\"\n", command, marker[1:]); err != nil {
		s.t.Fatalf("command %d %q: writing to bash: %v", s.n, command, err)
	}
	var out string
	code := -1
	testenv.WaitFor(s.t, timeout, func() string {
		return fmt.Sprintf("command %d %q to finish:\n%s", s.n, command, s.out.String()[before:])
	}, func() bool {
		o := s.out.String()[before:]
		i := strings.Index(o, marker)
		if i < 0 || !strings.Contains(o[i+len(marker):], "\n") {
			select {
			case <-s.exited:
				s.t.Fatalf("command %d %q: bash ended:\n%s", s.n, command, o)
			default:
			}
			return false
		}
		out = o[:i]
		fmt.Sscan(o[i+len(marker):], &code)
		return true
	})
	return code, out
}

var readmeListen = regexp.MustCompile(`--listen\s+(\S+)`)

// waitListening waits until a server a command started in the background
// answers: GET /readyz (rollgate serve) or /health (rollgate mock) with 200.
func waitListening(t *testing.T, addr string, s *shellSession) {
	t.Helper()
	addr = strings.Replace(addr, "0.0.0.0", "127.0.0.1", 1)
	testenv.WaitFor(t, 30*time.Second, func() string {
		return "the server of command " + fmt.Sprint(s.n) + " to answer on " + addr + ":\n" + s.out.String()
	}, func() bool {
		for _, p := range []string{"/readyz", "/health"} {
			if r, err := http.Get("http://" + addr + p); err == nil {
				r.Body.Close()
				if r.StatusCode == 200 {
					return true
				}
			}
		}
		return false
	})
}

// sessionEnv is the test's environment without settings that would change
// what the README's commands do (rollgate's own variables, an active venv),
// plus extra.
func sessionEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "ROLLGATE_") || strings.HasPrefix(k, "PIP_") || k == "VIRTUAL_ENV" || k == "AGL_KEY" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// copyRepo copies the repository's files (tracked and new, not ignored) into
// dir: a fresh clone of this checkout, with its uncommitted changes.
func copyRepo(t *testing.T, dir string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src, dst := filepath.Join(root, name), filepath.Join(dir, name)
		fi, err := os.Lstat(src)
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the work tree, or a symlink / submodule
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

// goVersion is the go line of go.mod.
func goVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	return string(m[1])
}

var readmeBridgeSummary = regexp.MustCompile(`bridge: (\d+) samples? in (\d+) groups?`)

// TestReadmeQuickstart runs the README's quickstart as written, in a copy of
// the repository: go build, serve with the built-in mock, a venv with the
// package installed the README's way, agent.py (the README's Python block),
// the bridge with default flags and load_batch. The batch must hold every
// call of the four rollouts, in one group (issue 30 items 1 and 2).
func TestReadmeQuickstart(t *testing.T) {
	const heading = "## Quickstart: from a clone to a training batch"
	sec := readmeSection(t, heading)
	if v := goVersion(t); !strings.Contains(sec, "Go "+v) {
		t.Errorf("the quickstart does not name go.mod's Go version %q (\"Go %s\")", v, v)
	}
	dir := filepath.Join(t.TempDir(), "rollgate")
	copyRepo(t, dir)
	addr := freeAddr(t)
	fix := func(s string) string { return strings.ReplaceAll(s, "127.0.0.1:8000", addr) }

	var cmds []string
	files := 0
	for _, b := range fencedBlocks(sec) {
		switch b.lang {
		case "sh":
			cmds = append(cmds, shellCommands(b.text)...)
		case "python":
			// A file the reader saves: its first line names it ("# agent.py").
			first, _, _ := strings.Cut(b.text, "\n")
			name := strings.TrimSpace(strings.TrimPrefix(first, "#"))
			if !strings.HasPrefix(first, "# ") || !strings.HasSuffix(name, ".py") || strings.ContainsAny(name, " /") {
				t.Fatalf("a python block of the quickstart must start with \"# NAME.py\" (the file the reader saves it as): %q", first)
			}
			if err := os.WriteFile(filepath.Join(dir, name), []byte(fix(b.text)), 0o644); err != nil {
				t.Fatal(err)
			}
			files++
		default:
			t.Fatalf("a ```%s block in the quickstart: the test runs sh and saves python blocks", b.lang)
		}
	}
	if len(cmds) == 0 || len(cmds) > 10 || files != 1 {
		t.Fatalf("the quickstart has %d commands (want 1 to 10) and %d python files (want agent.py):\n%q", len(cmds), files, cmds)
	}
	t.Logf("the quickstart's %d commands: %q", len(cmds), cmds)

	sh := newShellSession(t, dir, sessionEnv("ROLLGATE_LISTEN="+addr,
		"PIP_CONSTRAINT="+filepath.Join(dir, "python", "requirements", "package-constraints.txt"),
		"PIP_DISABLE_PIP_VERSION_CHECK=1"))
	sawBridge := false
	for i, c := range cmds {
		c = fix(c)
		start := time.Now()
		code, out := sh.run(c, 10*time.Minute)
		t.Logf("command %d (%s, exit %d): %s\n%s", i+1, time.Since(start).Round(time.Millisecond), code, c, out)
		if code != 0 {
			t.Fatalf("README quickstart command %d exited %d: %s\n%s", i+1, code, c, out)
		}
		if strings.HasSuffix(strings.TrimSpace(c), "&") {
			a := addr
			if m := readmeListen.FindStringSubmatch(c); m != nil {
				a = m[1]
			}
			waitListening(t, a, sh)
		}
		if strings.Contains(c, "rollgate bridge") {
			sawBridge = true
			m := readmeBridgeSummary.FindStringSubmatch(out)
			if m == nil || m[1] != "4" || m[2] != "1" {
				t.Fatalf("issue 30 item 2 (the natural path with default flags): %q should put every call of the 4 rollouts of agent.py "+
					"in the batch, 4 samples in 1 group (their task), and it printed:\n%s"+
					"(with --status '' added it does on the code of 2026-11-28: the default selection, succeeded,failed, "+
					"left out rollouts that no one gave a status)", c, out)
			}
		}
	}
	if !sawBridge {
		t.Fatal("the quickstart has no rollgate bridge command")
	}

	// What the README's last command loaded, checked here: the installed
	// package (not the source tree) reads the batch of the four rollouts.
	check := exec.Command(filepath.Join(dir, ".venv", "bin", "python"), "-c", `
import json, rollgate
t, nt, meta = rollgate.load_batch("batch.safetensors", backend="numpy")
print(json.dumps({"file": rollgate.__file__, "rows": int(t["responses"].shape[0]),
  "rollouts": sorted(nt["rollout_id"].tolist()), "uids": sorted(set(nt["uid"].tolist())),
  "tasks": sorted(set(nt["task_id"].tolist())), "adv": sorted(set(round(float(a), 4) for a in t["advantages"][:, 0]))}))`)
	check.Dir = dir
	b, err := check.CombinedOutput()
	if err != nil {
		t.Fatalf("loading the batch in the quickstart's venv: %v\n%s", err, b)
	}
	var got struct {
		File           string
		Rows           int
		Rollouts, Uids []string
		Tasks          []string
		Adv            []float64
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if !strings.Contains(got.File, filepath.Join(".venv", "lib")) || got.Rows != 4 ||
		strings.Join(got.Rollouts, ",") != "demo-0,demo-1,demo-2,demo-3" || len(got.Uids) != 1 ||
		strings.Join(got.Tasks, ",") != "say-something" || len(got.Adv) < 2 {
		t.Fatalf("the quickstart's batch: %+v (want rollgate from .venv, 4 rows demo-0..3, one uid, task say-something, advantages that differ)", got)
	}
}

// TestReadmeAgentLightning runs the README's "Coming from Agent Lightning"
// blocks as written (issue 30 item 7): the loopback try-out with the mock
// engine (the proxy route answers 503 until POST /api/models registers the
// engine, as the README says; then the calls AGL's trainer and agent make),
// and the exposed form on 0.0.0.0 with its two secrets.
func TestReadmeAgentLightning(t *testing.T) {
	sec := readmeSection(t, "## Coming from Agent Lightning")
	var blocks [][]string
	for _, b := range fencedBlocks(sec) {
		if b.lang != "sh" {
			t.Fatalf("a ```%s block in the Agent Lightning section: the test runs sh blocks", b.lang)
		}
		blocks = append(blocks, shellCommands(b.text))
	}
	if len(blocks) != 2 {
		t.Fatalf("the Agent Lightning section has %d sh blocks, want 2 (the try-out, the exposed form)", len(blocks))
	}
	dir := t.TempDir()
	b, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rollgate"), b, 0o755); err != nil { // built as in the quickstart
		t.Fatal(err)
	}
	gw, engine := freeAddr(t), freeAddr(t)
	_, exposedPort, _ := net.SplitHostPort(freeAddr(t))
	fix := strings.NewReplacer("127.0.0.1:8080", gw, "127.0.0.1:8001", engine, "0.0.0.0:8080", "0.0.0.0:"+exposedPort).Replace
	sh := newShellSession(t, dir, sessionEnv("PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH")))

	outs := map[string]string{}
	for i, c := range blocks[0] {
		c = fix(c)
		if strings.Contains(c, "/api/models") {
			// Before the engine is registered: 503, as the README says.
			key := sh.output(`echo "$AGL_KEY"`)
			aglPost := func(path, body string) (int, string) {
				r := gatewaytest.Do(t, "POST", "http://"+gw+path, body, "Authorization", "Bearer "+key)
				return r.Status, string(r.Body)
			}
			if code, body := aglPost("/api/rollouts", `[{"rollout_id":"r0","input":{}}]`); code != 201 {
				t.Fatalf("POST /api/rollouts: %d %s", code, body)
			}
			code, body := aglPost("/proxy/rollout/r0/attempt/0/mode/train/openai/v1/chat/completions", `{"model":"auto","messages":[{"role":"user","content":"hi"}]}`)
			if code != 503 || !strings.Contains(body, "No servers available for model") {
				t.Fatalf("the proxy route before POST /api/models: %d %s (the README says 503 No servers available)", code, body)
			}
		}
		code, out := sh.run(c, 2*time.Minute)
		t.Logf("command %d (exit %d): %s\n%s", i+1, code, c, out)
		if code != 0 {
			t.Fatalf("README Agent Lightning command %d exited %d: %s\n%s", i+1, code, c, out)
		}
		if strings.HasSuffix(strings.TrimSpace(c), "&") {
			m := readmeListen.FindStringSubmatch(c)
			if m == nil {
				t.Fatalf("command %d runs a server in the background without --listen: %s", i+1, c)
			}
			waitListening(t, m[1], sh)
		}
		outs[c] = out
	}
	want := map[string]string{ // a command's substring -> what its output must hold
		"/api/models":                 `"endpoint":"http://` + engine + `/v1"`,
		"/api/rollouts -H":            `"rollout_id":"r1"`,
		"/openai/v1/chat/completions": `"token_ids":[`,
		"/events -H":                  `"event_type":"reward"`,
		"format=triplet":              `"response_token_ids":[`,
	}
	for sub, w := range want {
		found := false
		for c, out := range outs {
			if strings.Contains(c, sub) {
				found = true
				if !strings.Contains(out, w) {
					t.Errorf("%s printed %q, want it to contain %s", c, out, w)
				}
			}
		}
		if !found {
			t.Errorf("the try-out has no command with %q", sub)
		}
	}
	var trip []struct {
		EventType string `json:"event_type"`
		Data      struct {
			ResponseTokenIDs []int     `json:"response_token_ids"`
			ResponseLogProbs []float64 `json:"response_log_probs"`
			Value            float64   `json:"value"`
		} `json:"data"`
	}
	for c, out := range outs {
		if strings.Contains(c, "format=triplet") {
			if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &trip); err != nil {
				t.Fatalf("the triplets: %v: %s", err, out)
			}
		}
	}
	if len(trip) != 2 || trip[0].EventType != "model_request" || len(trip[0].Data.ResponseTokenIDs) == 0 ||
		len(trip[0].Data.ResponseLogProbs) != len(trip[0].Data.ResponseTokenIDs) || trip[1].EventType != "reward" || trip[1].Data.Value != 1 {
		t.Fatalf("the triplets: %+v (want a model_request with ids and logprobs, then the reward 1)", trip)
	}

	// The exposed form, in the same terminal (AGL_KEY from the try-out); its
	// serve runs in the foreground as written, here in the background.
	for i, c := range blocks[1] {
		c = fix(c)
		server := strings.Contains(c, "rollgate serve")
		if server {
			c = "{ " + c + "\n} &" // a trailing comment would swallow a plain " &"
		}
		code, out := sh.run(c, time.Minute)
		if code != 0 {
			t.Fatalf("README Agent Lightning exposed-form command %d exited %d: %s\n%s", i+1, code, c, out)
		}
		if server {
			waitListening(t, "127.0.0.1:"+exposedPort, sh)
		}
	}
	key := sh.output(`echo "$AGL_KEY"`)
	admin := sh.output(`echo "$ROLLGATE_ADMIN_TOKEN"`)
	if len(key) < 16 || len(admin) < 16 {
		t.Fatalf("the README's secrets: AGL_KEY %q, ROLLGATE_ADMIN_TOKEN %q", key, admin)
	}
	base := "http://127.0.0.1:" + exposedPort
	f := func(method, path, auth, body string, want int) {
		t.Helper()
		h := []string{}
		if auth != "" {
			h = []string{"Authorization", "Bearer " + auth}
		}
		if r := gatewaytest.Do(t, method, base+path, body, h...); r.Status != want {
			t.Fatalf("%s %s (auth %q) on the exposed gateway: %d %s, want %d", method, path, auth, r.Status, r.Body, want)
		}
	}
	f("POST", "/api/rollouts", "", `[{"rollout_id":"x","input":{}}]`, 401)
	f("POST", "/api/rollouts", key, `[{"rollout_id":"x","input":{}}]`, 201)
	f("GET", "/api/v1/backends", "", "", 401)
	f("GET", "/api/v1/backends", admin, "", 200)
}

// output runs a short command of the test's own (reading a variable the
// README's commands set) and returns its trimmed output.
func (s *shellSession) output(command string) string {
	s.t.Helper()
	code, out := s.run(command, time.Minute)
	if code != 0 {
		s.t.Fatalf("%s: exit %d: %s", command, code, out)
	}
	return strings.TrimSpace(out)
}
