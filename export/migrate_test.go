package export

import (
	"slices"
	"testing"
)

// TestMigrations: the migration list holds every stored column once, in
// version order, each placed after a column of its table that an earlier
// or the same migration adds before it (so an ADD COLUMN ... AFTER always
// names a column the table has by then).
func TestMigrations(t *testing.T) {
	ms := Migrations()
	if len(ms) == 0 || ms[0].Version != 1 {
		t.Fatalf("first migration %+v, want version 1", ms)
	}
	have := map[string][]string{} // table -> columns once the migrations so far ran
	for i, m := range ms {
		if i > 0 && m.Version <= ms[i-1].Version {
			t.Errorf("migration %d after %d", m.Version, ms[i-1].Version)
		}
		for _, a := range m.Adds {
			if a.Column.Since != m.Version {
				t.Errorf("%s.%s (since %d) in migration %d", a.Table, a.Column.Name, a.Column.Since, m.Version)
			}
			if slices.Contains(have[a.Table], a.Column.Name) {
				t.Errorf("%s.%s added twice", a.Table, a.Column.Name)
			}
			if a.After != "" && !slices.Contains(have[a.Table], a.After) {
				t.Errorf("%s.%s after %q, which the table does not have yet", a.Table, a.Column.Name, a.After)
			}
			have[a.Table] = append(have[a.Table], a.Column.Name)
		}
	}
	for _, tb := range Tables() {
		var want []string
		for _, c := range tb.Columns {
			want = append(want, c.Name)
		}
		got := slices.Clone(have[tb.Name])
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: migrations add %q, the table has %q", tb.Name, got, want)
		}
	}
}
