package agl

import (
	"encoding/json"
	"testing"

	"github.com/rollgate/rollgate/gateway"
)

// FuzzDecodeBodies: any JSON value given as a RolloutCreate item or a
// RolloutStatusPatch is either refused with 422 items that encode, or
// decoded: a create into a task with a valid rollout id and metadata that is
// a JSON object, a patch into members that are strings or null.
func FuzzDecodeBodies(f *testing.F) {
	for _, s := range []string{`{"input":1}`, `{"input":1,"is_train":0,"metadata":{"batch_idx":2},"rollout_id":"r"}`,
		`{"state":"running","k8s_job_name":null}`, `{"State":1}`, `[1]`, `null`, `{"input":1,"input":2,"config":{"local":{}}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		task, errs := decodeCreate(0, b)
		if _, err := json.Marshal(errs); err != nil {
			t.Fatalf("create %s: 422 items do not encode: %v", b, err)
		}
		if len(errs) == 0 && (!gateway.ValidID([]byte(task.RolloutID)) || !isObject(task.Metadata) || !json.Valid(task.Metadata)) {
			t.Fatalf("create %s: task %+v", b, task)
		}
		p, errs := decodeStatusPatch(b)
		if _, err := json.Marshal(errs); err != nil {
			t.Fatalf("patch %s: 422 items do not encode: %v", b, err)
		}
		if len(errs) == 0 {
			for _, v := range []patchString{p.State, p.K8sJobName, p.LastAttemptID, p.ErrorMessage} {
				if v.raw != nil {
					t.Fatalf("patch %s: accepted a member that is not a string: %s", b, v.raw)
				}
			}
		}
	})
}
