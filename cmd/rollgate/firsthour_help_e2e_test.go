package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// runExit runs the binary and returns its stdout, stderr and exit code.
func runExit(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("rollgate %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

// helpSections parses a command's --help: its section titles in order and
// the flags under each.
func helpSections(t *testing.T, help string) (titles []string, flags map[string][]string) {
	t.Helper()
	flags = map[string][]string{}
	title := ""
	for _, line := range strings.Split(help, "\n") {
		switch {
		case strings.HasPrefix(line, "  --"):
			if title == "" {
				t.Fatalf("flag line before any section: %q", line)
			}
			name, _, _ := strings.Cut(strings.TrimPrefix(line, "  --"), " ")
			flags[title] = append(flags[title], name)
		case strings.HasSuffix(line, ":") && line != "" && line[0] != ' ' && !strings.HasPrefix(line, "Flags"):
			title = strings.TrimSuffix(line, ":")
			titles = append(titles, title)
		}
	}
	return titles, flags
}

// TestHelpSections: serve's and bridge's --help group every flag in a
// section, essentials first; a flag no section takes (one added without its
// line in serveSections or bridgeSections) fails here, as does a name in
// those tables that is no flag.
func TestHelpSections(t *testing.T) {
	for _, tc := range []struct {
		cmd       string
		sections  []flagSection
		essential []string
	}{
		{"serve", serveSections, []string{"listen", "upstream", "upstream-kind", "db", "clickhouse"}},
		{"bridge", bridgeSections, []string{"db", "clickhouse", "out", "format"}},
	} {
		out, errOut, code := runExit(t, tc.cmd, "--help")
		if code != 0 || errOut != "" {
			t.Fatalf("%s --help: exit %d, stderr %q", tc.cmd, code, errOut)
		}
		titles, flags := helpSections(t, out)
		if len(titles) != len(tc.sections) || titles[0] != "Essentials" {
			t.Fatalf("%s --help sections %q, want the %d of the table, Essentials first (an \"Other\" section holds ungrouped flags):\n%s", tc.cmd, titles, len(tc.sections), out)
		}
		if got := flags["Essentials"]; !slices.Equal(got[:min(len(got), len(tc.essential))], tc.essential) {
			t.Errorf("%s --help essentials %q, want %q first", tc.cmd, got, tc.essential)
		}
		seen := map[string]string{}
		for _, title := range titles {
			if len(flags[title]) == 0 {
				t.Errorf("%s --help: section %q is empty", tc.cmd, title)
			}
			for _, f := range flags[title] {
				if prev, dup := seen[f]; dup {
					t.Errorf("%s --help: --%s in %q and %q", tc.cmd, f, prev, title)
				}
				seen[f] = title
			}
		}
		for _, s := range tc.sections {
			for _, name := range s.Flags {
				if _, ok := seen[name]; !ok && !strings.HasSuffix(name, "*") {
					t.Errorf("%s: section %q names --%s, which is no flag", tc.cmd, s.Title, name)
				}
			}
		}
		if tc.cmd == "serve" && len(seen) < 80 {
			t.Errorf("serve --help shows %d flags, want them all (80 or more)", len(seen))
		}
	}
	// Every flag serve registers is in a section, checked on the flag set
	// itself too (not only on what the help printed).
	fs := newFlagSet("serve", serveSummary, io.Discard, serveSections...)
	(&fileConfig{}).registerFlags(fs)
	if _, rest := sectionFlags(fs, serveSections); len(rest) > 0 {
		var names []string
		for _, f := range rest {
			names = append(names, f.Name)
		}
		t.Errorf("serve flags in no section of serveSections (help.go): %q", names)
	}
	// The root help groups the commands and is what --help says it is.
	out, _, code := runExit(t, "--help")
	if code != 0 || !strings.Contains(out, "Testing and benchmarks:") || strings.Index(out, "rollgate serve") > strings.Index(out, "rollgate mock") {
		t.Errorf("root --help: exit %d, want serve before the testing commands:\n%s", code, out)
	}
}

// TestMisspeltFlag: a misspelt flag or command is one line on stderr with
// the closest names and the way to the help, exit status 2, and nothing on
// stdout (it was 173 lines of help); -h still prints the help.
func TestMisspeltFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--upstrem", "http://127.0.0.1:1/v1"}, "rollgate serve: unknown flag --upstrem; did you mean --upstream? (rollgate serve --help lists every flag)"},
		{[]string{"serve", "-lisen=:0"}, "unknown flag --lisen; did you mean --listen?"},
		{[]string{"serve", "--modle", "m"}, "did you mean --model?"},
		{[]string{"serve", "--otlp", "x"}, "did you mean --otlp-compression, --otlp-endpoint or --otlp-gateway-sample-ratio?"},
		{[]string{"serve", "--zzzzzz"}, "unknown flag --zzzzzz (rollgate serve --help lists every flag)"},
		{[]string{"serve", "--retries", "many"}, `invalid value "many" for flag -retries`},
		{[]string{"bridge", "--stauts", "succeeded"}, "rollgate bridge: unknown flag --stauts; did you mean --status?"},
		{[]string{"sql", "--dbb", "x.db", "SELECT 1"}, "did you mean --db?"},
		{[]string{"serv"}, `rollgate: unknown command "serv"; did you mean serve? Run "rollgate --help" for the commands.`},
	} {
		out, errOut, code := runExit(t, tc.args...)
		if code != 2 {
			t.Errorf("%q: exit %d, want 2", tc.args, code)
		}
		if out != "" {
			t.Errorf("%q: %d lines on stdout, want none:\n%s", tc.args, strings.Count(out, "\n"), out)
		}
		if n := strings.Count(errOut, "\n"); n != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: stderr of %d lines %q, want one line with %q", tc.args, n, errOut, tc.want)
		}
		if !strings.Contains(errOut, "--help") {
			t.Errorf("%q: %q does not point to --help", tc.args, errOut)
		}
	}
	out, errOut, code := runExit(t, "serve", "-h")
	if code != 0 || errOut != "" || !strings.Contains(out, "--upstream") {
		t.Fatalf("serve -h: exit %d, stderr %q, stdout %d bytes", code, errOut, len(out))
	}
}

// TestClosestFlags pins the suggestion rule on a flag set of its own.
func TestClosestFlags(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	for _, n := range []string{"db", "listen", "upstream", "upstream-kind", "capture-queue", "capture-queue-bytes"} {
		fs.String(n, "", "")
	}
	for _, tc := range []struct {
		typo string
		want []string
	}{
		{"upstrem", []string{"upstream"}},
		{"upsteram", []string{"upstream"}}, // a transposition is one edit
		{"capture-qeue", []string{"capture-queue"}},
		{"upstream-", []string{"upstream", "upstream-kind"}}, // names it starts count as close
		{"d", []string{"db"}},
		{"frobnicate", nil},
	} {
		if got := closestFlags(fs, tc.typo, 3); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.typo, got, tc.want)
		}
	}
}

// TestPortInUse: serve on a port another process holds says so in one
// error naming --listen and another port, and never that it is listening.
func TestPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	_, errOut, code := runExit(t, "serve", "--listen", addr, "--db", filepath.Join(t.TempDir(), "r.db"))
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	want := "rollgate serve: --listen " + addr + ": the port is in use by another process (another rollgate?); stop it or pick another port, e.g. --listen 127.0.0.1:" + strconv.Itoa(port+1)
	if !strings.Contains(errOut, want) {
		t.Errorf("stderr lacks %q:\n%s", want, errOut)
	}
	if strings.Contains(errOut, "listening") {
		t.Errorf("stderr says it is listening on a port it could not bind:\n%s", errOut)
	}
}

// apiError is an OpenAI-style error body.
type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// send posts body with a Content-Type (none when empty) and decodes the
// OpenAI-style error of the answer.
func send(t *testing.T, url, contentType, body string) (int, apiError) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	var e apiError
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("POST %s: %d, not an OpenAI-style error: %v: %s", url, r.StatusCode, err, b)
	}
	return r.StatusCode, e
}

// TestFirstHourErrors: through a running serve, the mistakes of a first
// hour get an answer that says what is wrong and the fix: malformed JSON
// (where, and no Content-Type advice to a caller who sent JSON), a
// per-rollout URL without its attempt (the expected form), and the admin
// token guarding what the help says (every /api/v1 route, reads included,
// and /ui).
func TestFirstHourErrors(t *testing.T) {
	t.Setenv("ROLLGATE_ADMIN_TOKEN", "first-hour-token")
	addr := freeAddr(t)
	start(t, addr, "/readyz", "serve", "--listen", addr, "--db", filepath.Join(t.TempDir(), "r.db"))
	base := "http://" + addr

	status, e := send(t, base+"/rollout/r1/attempt/1/v1/chat/completions", "application/json", "{\"model\":\"mock-model\",\n \"messages\":[],}")
	if status != 400 || e.Error.Type != "invalid_request_error" ||
		!strings.Contains(e.Error.Message, "request body is not valid JSON: invalid character '}' looking for beginning of object key string at byte 39 (line 2, column 16)") {
		t.Errorf("malformed JSON: %d %+v", status, e)
	}
	if strings.Contains(e.Error.Message, "Content-Type") {
		t.Errorf("malformed JSON sent as application/json: the answer tells to send Content-Type: %q", e.Error.Message)
	}
	status, e = send(t, base+"/v1/chat/completions", "text/plain", "model=mock-model")
	if status != 400 || !strings.Contains(e.Error.Message, `Content-Type is "text/plain": send the body with Content-Type: application/json`) {
		t.Errorf("form body as text/plain: %d %+v", status, e)
	}
	status, e = send(t, base+"/v1/chat/completions", "application/json", `[{"model":"mock-model"}]`)
	if status != 400 || !strings.Contains(e.Error.Message, "request body is a JSON array, not an object") {
		t.Errorf("array body: %d %+v", status, e)
	}

	status, e = send(t, base+"/rollout/x/v1/chat/completions", "application/json", `{"model":"mock-model","messages":[]}`)
	want := "per-rollout calls go to /rollout/{rollout_id}/attempt/{attempt_id}/v1/... (OpenAI routes: chat/completions, completions, responses, embeddings, models), e.g. /rollout/x/attempt/1/v1/chat/completions"
	if status != 404 || e.Error.Type != "not_found_error" || e.Error.Code != 404 || !strings.Contains(e.Error.Message, want) {
		t.Errorf("/rollout/x/v1/chat/completions: %d %+v, want 404 with %q", status, e, want)
	}

	// The root help's account of the admin token is what the gateway does.
	help, _, _ := runExit(t, "--help")
	if !strings.Contains(help, "every /api/v1\n                             route (reads included), the viewer /ui") || strings.Contains(help, "write routes") {
		t.Fatalf("root --help on ROLLGATE_ADMIN_TOKEN:\n%s", help)
	}
	for _, path := range []string{"/api/v1/rollouts", "/api/v1/backends", "/ui/"} {
		r, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != 401 {
			t.Errorf("GET %s without the admin token: %d, want 401 as --help says", path, r.StatusCode)
		}
	}
}
