package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
)

// TestMessagesE2E runs an Anthropic Messages agent through the real binary
// in front of the mock engine (vLLM's shapes): a forced tool call (not
// streamed, attributed by path, system prompt as blocks), the tool's result
// sent back (streamed), and a text turn attributed by headers with the
// Anthropic SDK's x-api-key. It checks the answers' Anthropic shapes (the
// stream's events in order), the rows (endpoint /v1/messages, sequence ids
// in call order, engine token ids), that each row's ids are the engine's
// (the row's chat request sent straight to the engine gives the same ids
// and text), and that bad input (refused by the gateway: no row) and the
// engine's own refusals come back as Anthropic errors naming the field.
func TestMessagesE2E(t *testing.T) {
	mockAddr, addr := freeAddr(t), freeAddr(t)
	start(t, mockAddr, "/health", "mock", "--listen", mockAddr)
	db := filepath.Join(t.TempDir(), "m.db")
	_, logs := start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db, "--upstream", "http://"+mockAddr+"/v1", "--upstream-kind", "vllm")
	store, err := sqlite.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	base := "http://" + addr + "/rollout/msg/attempt/a1/v1/messages"
	tools := `[{"name":"get_weather","description":"Weather of a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}]`
	user := `{"role":"user","content":"What is the weather in Paris?"}`

	// 1. A forced tool call, not streamed.
	status, body, hdr := post(t, base, `{"model":"mock-model","max_tokens":64,"system":[{"type":"text","text":"You are "},{"type":"text","text":"a weather bot."}],`+
		`"tools":`+tools+`,"tool_choice":{"type":"tool","name":"get_weather"},"messages":[`+user+`]}`)
	if status != 200 || gjson.Get(body, "type").String() != "message" || gjson.Get(body, "stop_reason").String() != "tool_use" {
		t.Fatalf("tool call: %d %s\n%s", status, body, logs)
	}
	use := gjson.Get(body, `content.#(type=="tool_use")`)
	if use.Get("id").String() == "" || use.Get("name").String() != "get_weather" || !use.Get("input").IsObject() {
		t.Fatalf("tool call: no tool_use block with an id and an object input: %s", body)
	}
	if hdr.Get("X-Sequence-Id") != "1" {
		t.Fatalf("first call: X-Sequence-Id %q, want 1", hdr.Get("X-Sequence-Id"))
	}

	// 2. The tool's result sent back, streamed.
	turn2 := `{"model":"mock-model","max_tokens":24,"stream":true,"tools":` + tools + `,"messages":[` + user + `,` +
		`{"role":"assistant","content":[` + use.Raw + `]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":` + use.Get("id").Raw + `,"content":[{"type":"text","text":"18 C, sunny"}]}]}]}`
	events, text := messagesEvents(t, base, turn2, nil)
	names := make([]string, len(events))
	for i, e := range events {
		names[i] = e.name
		if got := gjson.Get(e.data, "type").String(); got != e.name {
			t.Fatalf("event %d is named %q but its data's type is %q", i, e.name, got)
		}
	}
	if len(names) < 5 || names[0] != "message_start" || names[len(names)-2] != "message_delta" || names[len(names)-1] != "message_stop" ||
		!slices.Contains(names, "content_block_start") || !slices.Contains(names, "content_block_stop") {
		t.Fatalf("stream events %v", names)
	}
	delta := events[len(events)-2].data
	if r := gjson.Get(delta, "delta.stop_reason").String(); r != "end_turn" && r != "max_tokens" && r != "tool_use" {
		t.Fatalf("message_delta: %s", delta)
	}

	// 3. Attributed by headers, with the Anthropic SDK's key header.
	_, text3 := messagesEvents(t, "http://"+addr+"/v1/messages", `{"model":"mock-model","max_tokens":16,"messages":[{"role":"user","content":"Hi"}]}`,
		map[string]string{"x-rollout-id": "msg", "x-attempt-id": "a1", "x-api-key": "sk-ant-unused", "anthropic-version": "2023-06-01"})

	rows := tiRows(t, store, "msg", "a1", 3, logs)
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3", len(rows))
	}
	for i, r := range rows {
		if r.Endpoint != "/v1/messages" || r.SequenceID != uint64(i+1) || r.TokenSource != export.TokenSourceEngine || len(r.PromptTokenIDs) == 0 || len(r.ResponseTokenIDs) == 0 {
			t.Fatalf("row %d: endpoint %q sequence %d token_source %q, %d prompt and %d response ids", i, r.Endpoint, r.SequenceID, r.TokenSource, len(r.PromptTokenIDs), len(r.ResponseTokenIDs))
		}
		if strings.Contains(r.RequestBody, "sk-ant-unused") {
			t.Fatalf("row %d stores the client's key", i)
		}
		// The engine's own answer to the row's request: the same ids.
		direct, err := sjson.Set(r.RequestBody, "stream", false)
		if err == nil {
			direct, err = sjson.Delete(direct, "stream_options")
		}
		if err == nil {
			direct, err = sjson.Set(direct, "return_token_ids", true)
		}
		if err != nil {
			t.Fatal(err)
		}
		st, ans, _ := post(t, "http://"+mockAddr+"/v1/chat/completions", direct)
		var got struct {
			PromptTokenIDs []uint32 `json:"prompt_token_ids"`
			Choices        []struct {
				TokenIDs []uint32 `json:"token_ids"`
				Message  struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		if st != 200 || json.Unmarshal([]byte(ans), &got) != nil || len(got.Choices) != 1 {
			t.Fatalf("row %d: the engine answered its request %d %s", i, st, ans)
		}
		if !slices.Equal(got.PromptTokenIDs, r.PromptTokenIDs) || !slices.Equal(got.Choices[0].TokenIDs, r.ResponseTokenIDs) {
			t.Fatalf("row %d: ids differ from the engine's:\nrow    %v %v\nengine %v %v", i, r.PromptTokenIDs, r.ResponseTokenIDs, got.PromptTokenIDs, got.Choices[0].TokenIDs)
		}
		if want := []string{"", text, text3}[i]; i > 0 && got.Choices[0].Message.Content != want {
			t.Fatalf("row %d: the client got text %q, the engine answers %q", i, want, got.Choices[0].Message.Content)
		}
	}
	// Capture's turn check reads these rows as chat ones (openai.ChatShaped).
	if rows[1].TurnKind == "" || rows[1].TurnPrevSequenceID != 1 {
		t.Fatalf("row 1: turn_kind %q after sequence id %d, want the turn checked against call 1", rows[1].TurnKind, rows[1].TurnPrevSequenceID)
	}
	if !strings.Contains(rows[0].RequestBody, `"content":"You are a weather bot."`) || !strings.Contains(rows[1].RequestBody, `"role":"tool"`) {
		t.Fatalf("stored chat requests: %s\n%s", rows[0].RequestBody, rows[1].RequestBody)
	}

	// Bad input and engine errors: Anthropic's error shape, no row.
	for _, c := range []struct {
		body, field string
		status      int
		typ         string
	}{
		{`{"model":"mock-model","max_tokens":8,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`, "messages[0].content[0].type", 400, "invalid_request_error"},
		{`{"model":"mock-model","messages":[{"role":"user","content":"x"}]}`, "max_tokens", 400, "invalid_request_error"},
		{`{"model":"mock-model","max_tokens":8,"n":2,"messages":[{"role":"user","content":"x"}]}`, `"n"`, 400, "invalid_request_error"},
		{`{"model":"mock-model","max_tokens":8,"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"x"}]}`, "tools[0].type", 400, "invalid_request_error"},
		{`[1]`, "request body", 400, "invalid_request_error"},
		// The engine's own refusal (vLLM's context length check), in Anthropic's shape.
		{`{"model":"mock-model","max_tokens":100000,"messages":[{"role":"user","content":"x"}]}`, "maximum context length", 400, "invalid_request_error"},
	} {
		st, b, _ := post(t, base, c.body)
		if st != c.status || gjson.Get(b, "type").String() != "error" || gjson.Get(b, "error.type").String() != c.typ || !strings.Contains(gjson.Get(b, "error.message").String(), c.field) {
			t.Errorf("%s: %d %s, want %d %s naming %q", c.body, st, b, c.status, c.typ, c.field)
		}
	}
	all, err := store.Calls(context.Background(), export.CallFilter{RolloutID: "msg"})
	if err != nil || len(all) != 3 {
		t.Fatalf("%d rows after the refused calls (%v), want 3", len(all), err)
	}
}

type sseEvent struct{ name, data string }

// messagesEvents posts a streamed Messages request and returns its events
// and the text of its text blocks.
func messagesEvents(t *testing.T, url, body string, headers map[string]string) ([]sseEvent, string) {
	t.Helper()
	body, _ = sjson.Set(body, "stream", true)
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s: %d %s %s", url, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	var events []sseEvent
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	var cur sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.name = line[7:]
		case strings.HasPrefix(line, "data: "):
			cur.data = line[6:]
		case line == "" && cur.name != "":
			events = append(events, cur)
			if d := gjson.Get(cur.data, "delta"); d.Get("type").String() == "text_delta" {
				text.WriteString(d.Get("text").String())
			}
			cur = sseEvent{}
		case line != "":
			t.Fatalf("unexpected line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(events) == 0 || events[len(events)-1].name != "message_stop" {
		t.Fatalf("stream did not end with message_stop: %v", events)
	}
	for i, e := range events {
		if e.name == "error" {
			t.Fatalf("event %d is an error: %s", i, e.data)
		}
	}
	return events, text.String()
}

// TestMessagesClientKey: with client keys on, the Anthropic SDK's x-api-key
// is the agent's key (a wrong one is a 401 in Anthropic's shape, and stores
// nothing; the right one is served and its row names the key).
func TestMessagesClientKey(t *testing.T) {
	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "k.db")
	t.Setenv("ROLLGATE_CLIENT_KEYS", "agents=sk-ant-right")
	_, logs := start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db)
	store, err := sqlite.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	call := func(key string) (int, string) {
		req, _ := http.NewRequest("POST", "http://"+addr+"/rollout/key/attempt/a1/v1/messages",
			strings.NewReader(`{"model":"mock-model","max_tokens":8,"messages":[{"role":"user","content":"Hi"}]}`))
		req.Header.Set("content-type", "application/json")
		req.Header.Set("x-api-key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, b := call("sk-ant-wrong"); st != 401 || gjson.Get(b, "error.type").String() != "authentication_error" || gjson.Get(b, "type").String() != "error" {
		t.Fatalf("wrong key: %d %s", st, b)
	}
	if st, b := call("sk-ant-right"); st != 200 || gjson.Get(b, "type").String() != "message" {
		t.Fatalf("right key: %d %s\n%s", st, b, logs)
	}
	rows := tiRows(t, store, "key", "a1", 1, logs)
	if len(rows) != 1 || rows[0].SequenceID != 1 || rows[0].APIKeyName != "agents" {
		t.Fatalf("rows %+v", rows)
	}
}
