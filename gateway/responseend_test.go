package gateway

import "testing"

func TestIsResponseEnd(t *testing.T) {
	f := func(data string, want bool) {
		t.Helper()
		if got := isResponseEnd([]byte(data)); got != want {
			t.Fatalf("isResponseEnd(%s) = %v, want %v", data, got, want)
		}
	}
	f(`{"type":"response.completed","sequence_number":9,"response":{}}`, true)
	f(`{"type":"response.incomplete","response":{}}`, true)
	f(`{"type":"response.failed","response":{}}`, true)
	f(`{"type":"response.created","response":{}}`, false)
	f(`{"type":"response.output_text.delta","delta":"completed"}`, false)
	f(`{"type":"response.completedx"}`, false)
	f(`[DONE]`, false)
	f(``, false)
}
