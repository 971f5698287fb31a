package export

import (
	"cmp"
	"slices"
)

// Migration is one version of the stored schema: the columns that version
// added (ColumnInfo.Since), table by table in table order. Version 1 holds
// every column of the first spool release, some of which files and
// databases of earlier releases still lack.
type Migration struct {
	Version byte
	Adds    []ColumnAdd
}

// ColumnAdd is one column a migration adds to a table that lacks it.
type ColumnAdd struct {
	Table  string
	Column ColumnInfo
	// After is the column the new one follows in a new table's layout
	// (the nearest one before it in table order that a migration up to
	// this one adds), "" for the first column. A store that places columns
	// (ClickHouse's ADD COLUMN ... AFTER) gives an upgraded table the
	// layout of a new one.
	After string
}

// Migrations is the schema's history, derived from the column tables
// (Tables): one migration per Since version, oldest first. A store brings
// an older table up to date by walking it in order and adding each column
// its table lacks; no column is ever dropped or changed.
func Migrations() []Migration {
	var out []Migration
	for _, t := range Tables() {
		for i, c := range t.Columns {
			add := ColumnAdd{Table: t.Name, Column: c}
			for j := i - 1; j >= 0; j-- {
				if t.Columns[j].Since <= c.Since {
					add.After = t.Columns[j].Name
					break
				}
			}
			k, found := slices.BinarySearchFunc(out, c.Since, func(m Migration, v byte) int { return cmp.Compare(m.Version, v) })
			if !found {
				out = slices.Insert(out, k, Migration{Version: c.Since})
			}
			out[k].Adds = append(out[k].Adds, add)
		}
	}
	return out
}
