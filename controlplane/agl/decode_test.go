package agl_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

// decodeCases are request bodies of POST /api/rollouts and PATCH
// /api/rollouts/r1, valid and not, with the answer each gets: the status
// and, for a 422, the whole body (pydantic's items, in order).
var decodeCases = []struct{ method, path, body string }{
	{"POST", "/api/rollouts", `[{"input":1,"rollout_id":"r1","unknown":"ignored"}]`},
	{"POST", "/api/rollouts", `[{"input":1,"rollout_id":"r2","is_train":0},{"input":2,"rollout_id":"r3","is_train":1}]`},
	{"POST", "/api/rollouts", `[{"input":{"data_id":"d"},"rollout_id":"r4","metadata":{"batch_idx":2.0,"k":"v"},"config":{"timeout_seconds":5}}]`},
	{"POST", "/api/rollouts", `{}`},
	{"POST", "/api/rollouts", `[]`},
	{"POST", "/api/rollouts", ` `},
	{"POST", "/api/rollouts", `not json`},
	{"POST", "/api/rollouts", `[1, "x", null]`},
	{"POST", "/api/rollouts", `[{"is_train":true}]`},
	{"POST", "/api/rollouts", `[{"input":1,"is_train":"maybe"}]`},
	{"POST", "/api/rollouts", `[{"input":1,"is_train":null}]`},
	{"POST", "/api/rollouts", `[{"input":1,"is_train":2}]`},
	{"POST", "/api/rollouts", `[{"input":1,"rollout_id":"a b"}]`},
	{"POST", "/api/rollouts", `[{"input":1,"rollout_id":7}]`},
	{"POST", "/api/rollouts", `[{"input":1,"rollout_id":null,"config":null,"metadata":null}]`},
	{"POST", "/api/rollouts", `[{"input":1,"config":[1]}]`},
	{"POST", "/api/rollouts", `[{"input":1,"config":{"timeout_seconds":"x"}}]`},
	{"POST", "/api/rollouts", `[{"input":1,"metadata":[1]}]`},
	{"POST", "/api/rollouts", `[{"input":1,"metadata":{"batch_idx":1.5,"sample_idx_in_batch":"3"}}]`},
	{"POST", "/api/rollouts", `[{"is_train":"x","rollout_id":5,"metadata":3,"config":4}]`},
	{"POST", "/api/rollouts", `[{"Input":1,"rollout_id":"r9"}]`},
	{"POST", "/api/rollouts", `[{"input":1,"rollout_id":"r10","rollout_id":"r11"}]`},
	{"GET", "/api/rollouts/r11", ``},
	{"PATCH", "/api/rollouts/r1", `{"status":{"color":"red"}}`},
	{"PATCH", "/api/rollouts/r1", `{"status":{"State":"running"}}`},
	{"PATCH", "/api/rollouts/r1", `{"status":{"state":"done"}}`},
	{"PATCH", "/api/rollouts/r1", `{"status":{"state":5,"k8s_job_name":3}}`},
	{"PATCH", "/api/rollouts/r1", `{"status":{"last_attempt_id":"a b"}}`},
	{"PATCH", "/api/rollouts/r1", `{"status":[1]}`},
	{"PATCH", "/api/rollouts/r1", `[1]`},
	{"PATCH", "/api/rollouts/r1", `{"other":1}`},
	{"PATCH", "/api/rollouts/r1", `{"status":null}`},
	{"PATCH", "/api/rollouts/r1", `{"status":{"k8s_job_name":"job","error_message":null}}`},
	{"PATCH", "/api/rollouts/r1", `{"status":{"state":"running","last_attempt_id":"at-1"}}`},
	{"PATCH", "/api/rollouts/nope", `{"status":{"state":"running"}}`},
	{"POST", "/api/models", `[{"model":"policy"}]`},
	{"POST", "/api/models", `{"model":"policy","endpoint":"x"}`},
	{"POST", "/api/models", `[1, {"model":1,"endpoint":null,"version":1.5}, {"Model":"m","endpoint":"http://127.0.0.1:9"}]`},
	{"POST", "/api/models", `[{"model":"m","endpoint":"http://127.0.0.1:9/v1/","version":"2"}]`},
	{"POST", "/api/models", `[{"model":"m","endpoint":"ftp://x"}]`},
	{"POST", "/proxy/pause", ``},
	{"POST", "/proxy/pause", `[]`},
	{"POST", "/proxy/pause", `{"retry_after_seconds":"soon","reason":3}`},
	{"POST", "/proxy/pause", `{"retry_after_seconds":1.5}`},
	{"POST", "/proxy/pause", `{"retry_after_seconds":-1}`},
	{"POST", "/proxy/pause", `{"retry_after_seconds":86401}`},
	{"POST", "/proxy/pause", `{"retry_after_seconds":2.0,"reason":null,"other":1}`},
	{"GET", "/proxy/state", ``},
	{"POST", "/proxy/pause", `{"Retry_After_Seconds":7,"reason":"r","reason":"s"}`},
	{"GET", "/proxy/state", ``},
	{"POST", "/proxy/resume", ``},
	{"POST", "/api/rollouts/r1/attempt/0/events", `{"data":{}}`},
	{"POST", "/api/rollouts/r1/attempt/0/events", `{"event_type":"x","data":[1]}`},
	{"POST", "/api/rollouts/r1/attempt/0/events", `{"event_type":5,"data":null}`},
	{"POST", "/api/rollouts/r1/attempt/0/events", `{"event_type":"reward","data":{"value":1e999}}`},
	{"POST", "/api/rollouts/r1/attempt/0/events", `{"event_type":"reward","data":{"value":-1e999,"source":3}}`},
	{"POST", "/api/rollouts/r1/attempt/0/events", `{"event_type":"note","data":{"value":1e999}}`},
	{"POST", "/api/rollouts/r1/attempt/0/events", `{"event_type":"reward","data":{"value":0.5,"source":"judge"},"other":1}`},
	{"POST", "/api/rollouts/r1/attempt/0/events", `{"event_type":"x"}`},
	{"POST", "/api/rollouts/r1/attempt/0/events", `[]`},
	{"POST", "/api/rollouts/nope/attempt/0/events", `{"event_type":"x"}`},
	{"GET", "/api/rollouts/r1/events", ``},
}

// TestRolloutBodiesDecoded pins the answers to the bodies of decodeCases
// (testdata/decode.golden, written on the code that decoded them with gjson
// by hand): AGL v1.0's clients see the same statuses and 422 items. Two
// answers changed on purpose with encoding/json, to AGL's own: a member
// given twice counts the last (Python's json; gjson took the first: GET
// r11 was 404, the paused reason was "r"), and {"status": null} is no change, 200 (RolloutPatch's
// status is nullable; gjson walked null as one member named "": 422).
func TestRolloutBodiesDecoded(t *testing.T) {
	store, _ := gatewaytest.OpenSQLite(t)
	e := newAGL(t, store, "")
	var got strings.Builder
	for _, c := range decodeCases {
		r := gatewaytest.Do(t, c.method, e.URL+c.path, c.body, "Authorization", "Bearer "+key)
		got.WriteString(c.method + " " + c.path + " " + c.body + "\n  -> " + strconv.Itoa(r.Status))
		if r.Status == 422 || strings.HasPrefix(c.path, "/proxy/state") || strings.HasSuffix(c.path, "/events") && c.method == "GET" {
			got.WriteString(" " + string(r.Body))
		}
		got.WriteString("\n")
	}
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile("testdata/decode.golden", []byte(got.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/decode.golden")
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != string(want) {
		gl, wl := strings.Split(got.String(), "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Errorf("line %d:\n got %s\nwant %s", i+1, gl[i], wl[i])
			}
		}
	}
}
