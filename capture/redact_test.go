package capture

import (
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
)

func TestRedactor(t *testing.T) {
	r, err := NewRedactor([]RedactRule{
		{Name: "api-keys", Pattern: `sk-[A-Za-z0-9]{20,}`, Replacement: "[KEY]"},
		{Name: "emails", Pattern: `([A-Za-z0-9._%+-]+)@[A-Za-z0-9.-]+\.[A-Za-z]{2,}`, Replacement: "<$1@…>", Fields: []string{FieldRequestBody, FieldError}},
	})
	if err != nil {
		t.Fatal(err)
	}
	row := export.Call{
		RequestBody:      `{"messages":[{"role":"user","content":"key sk-abcdefghijklmnopqrstuvwxyz12 mail bob@example.com"}]}`,
		ResponseBody:     `{"choices":[{"message":{"content":"use sk-abcdefghijklmnopqrstuvwxyz12, write bob@example.com"}}]}`,
		ResponseMessage:  `{"role":"assistant","content":"sk-ZZZZZZZZZZZZZZZZZZZZZZZZ"}`,
		Error:            "upstream said bob@example.com is unknown",
		PromptTokenIDs:   []uint32{1, 2, 3},
		ResponseTokenIDs: []uint32{4, 5},
	}
	hits := map[string]int{}
	r.Apply(&row, func(rule string) { hits[rule]++ })
	if strings.Contains(row.RequestBody+row.ResponseBody+row.ResponseMessage, "sk-") {
		t.Fatalf("key left: %+v", row)
	}
	if !strings.Contains(row.RequestBody, "[KEY]") || !strings.Contains(row.RequestBody, "<bob@…>") {
		t.Fatalf("request body: %s", row.RequestBody)
	}
	// The email rule is limited to request_body and error.
	if !strings.Contains(row.ResponseBody, "bob@example.com") || row.Error != "upstream said <bob@…> is unknown" {
		t.Fatalf("fields: response_body %s error %s", row.ResponseBody, row.Error)
	}
	if len(row.PromptTokenIDs) != 3 || len(row.ResponseTokenIDs) != 2 {
		t.Fatal("token ids touched")
	}
	if hits["api-keys"] != 1 || hits["emails"] != 1 {
		t.Fatalf("hits %v", hits)
	}
	for _, bad := range [][]RedactRule{
		{{Name: "x", Pattern: `(unclosed`}},
		{{Name: "x", Pattern: ``}},
		{{Name: "x", Pattern: `a`, Fields: []string{"prompt_token_ids"}}},
	} {
		if _, err := NewRedactor(bad); err == nil || !strings.Contains(err.Error(), "redact x") {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	var none *Redactor
	none.Apply(&row, nil) // nil redactor: no-op
}
