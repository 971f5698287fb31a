package controlplane_test

import (
	"encoding/json"
	"testing"

	"github.com/rollgate/rollgate/controlplane"
)

// FuzzOTLPTraces: any body, as JSON or protobuf, is refused or becomes rows
// with well-formed ids and JSON attributes; nothing panics.
func FuzzOTLPTraces(f *testing.F) {
	f.Add([]byte(`{"resourceSpans":[{"resource":{"attributes":[{"key":"rollout_id","value":{"stringValue":"r"}}]},"scopeSpans":[{"spans":[{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"tool","status":{"code":2},"attributes":[{"key":"gen_ai.tool.name","value":{"stringValue":"search"}},{"key":"n","value":{"arrayValue":{"values":[{"intValue":"1"},{"kvlistValue":{"values":[{"key":"k","value":{"doubleValue":1.5}}]}}]}}}]}]}]}]}`), true)
	f.Add([]byte(`{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"00","spanId":"zz"}]}]}]}`), true)
	f.Add([]byte(`{"resource_spans":[]}`), true)
	f.Add([]byte("\x0a\x2b\x12\x29\x12\x27\x0a\x10\x5b\x8e\xff\xf7\x98\x03\x81\x03\xd2\x69\xb6\x33\x81\x3f\xc6\x0c\x12\x08\xee\xe1\x9b\x7e\xc3\xc1\xb1\x74\x2a\x04tool\x7a\x02\x18\x02"), false)
	f.Add([]byte{0xff, 0x01}, false)
	f.Fuzz(func(t *testing.T, body []byte, isJSON bool) {
		req, err := controlplane.DecodeOTLPTraces(body, isJSON)
		if err != nil {
			return
		}
		spans, rejected, why := controlplane.SpansFromOTLP(req, "r", "a", 1)
		if rejected > 0 && why == "" {
			t.Fatal("rejected spans without a reason")
		}
		for _, s := range spans {
			if len(s.TraceID) != 32 || len(s.SpanID) != 16 || (s.ParentSpanID != "" && len(s.ParentSpanID) != 16) {
				t.Fatalf("bad ids %q %q %q", s.TraceID, s.SpanID, s.ParentSpanID)
			}
			if !json.Valid([]byte(s.Attributes)) {
				t.Fatalf("attributes not JSON: %q", s.Attributes)
			}
		}
	})
}
