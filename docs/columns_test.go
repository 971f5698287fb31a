package docs

import (
	"os"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
)

// TestContractListsEveryColumn: §3 of contract.md describes every column
// of export's column table under its table's heading, so a new column
// cannot go undocumented.
func TestContractListsEveryColumn(t *testing.T) {
	b, err := os.ReadFile("contract.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, tbl := range export.Tables() {
		head := "\n### `" + tbl.Name + "`"
		i := strings.Index(doc, head)
		if i < 0 {
			t.Errorf("contract.md has no section %q", strings.TrimSpace(head))
			continue
		}
		section := doc[i+len(head):]
		if end := strings.Index(section, "\n#"); end >= 0 {
			section = section[:end]
		}
		for _, c := range tbl.Columns {
			if !strings.Contains(section, "`"+c.Name+"`") {
				t.Errorf("contract.md §3 %s does not describe column %s (export/row.go)", tbl.Name, c.Name)
			}
		}
	}
}
