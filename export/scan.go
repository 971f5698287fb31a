package export

import (
	"fmt"

	"github.com/rollgate/rollgate/export/arrays"
)

// IntScan is how a store's driver hands back integer and bool columns.
type IntScan uint8

// The stores' drivers.
const (
	// IntsNative: integers scan straight into their fields, bools through
	// a uint8 (ClickHouse's UInt8).
	IntsNative IntScan = iota
	// IntsAsInt64: integers and bools scan through an int64, uint64 bits
	// unchanged (SQLite's INTEGER).
	IntsAsInt64
)

// Scanner reads rows selected in column order into Row: text and float
// columns straight into its fields, integers and bools as ints says, arrays
// through their text form ([1,2,3], package arrays: SQLite keeps them so,
// and ClickHouse's toString gives them several times faster than its driver
// scans an array element by element). Row is overwritten by each Scan;
// callers copy it.
type Scanner[R any] struct {
	// Row is the row read by the last Scan.
	Row   R
	cols  []Column[R]
	dest  []any
	ints  []int64
	u8s   []uint8
	texts []string
}

// NewScanner returns a Scanner for a select of cols, in their order.
func NewScanner[R any](cols []Column[R], ints IntScan) *Scanner[R] {
	n := len(cols)
	s := &Scanner[R]{cols: cols, dest: make([]any, n), ints: make([]int64, n), u8s: make([]uint8, n), texts: make([]string, n)}
	for i, c := range cols {
		switch {
		case c.Type == TypeUint32s || c.Type == TypeFloat32s:
			s.dest[i] = &s.texts[i]
		case c.Type == TypeString || c.Type == TypeFloat64:
			s.dest[i] = c.Field(&s.Row)
		case ints == IntsAsInt64:
			s.dest[i] = &s.ints[i]
		case c.Type == TypeBool:
			s.dest[i] = &s.u8s[i]
		default:
			s.dest[i] = c.Field(&s.Row)
		}
	}
	return s
}

// Scan reads the current row of rows into s.Row; id names the row in
// errors.
func (s *Scanner[R]) Scan(rows interface{ Scan(...any) error }, id func(*R) string) error {
	if err := rows.Scan(s.dest...); err != nil {
		return err
	}
	for i := range s.cols {
		c := &s.cols[i]
		var err error
		switch p := s.dest[i].(type) {
		case *int64:
			switch f := c.Field(&s.Row).(type) {
			case *uint64:
				*f = uint64(*p)
			case *uint32:
				*f = uint32(*p)
			case *uint16:
				*f = uint16(*p)
			case *bool:
				*f = *p != 0
			}
		case *uint8:
			*c.Field(&s.Row).(*bool) = *p != 0
		case *string:
			switch c.Type {
			case TypeUint32s:
				*c.Field(&s.Row).(*[]uint32), err = arrays.ParseUint32s(*p)
			case TypeFloat32s:
				*c.Field(&s.Row).(*[]float32), err = arrays.ParseFloat32s(*p)
			}
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", id(&s.Row), c.Name, err)
		}
	}
	return nil
}
