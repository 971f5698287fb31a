package export

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// WriteTable prints r as an aligned text table, the output of `rollgate sql`:
//
//	 rollout_id | calls
//	------------+-------
//	 r1         | 3
//	(1 row)
//
// Control characters inside values (newlines, tabs) are escaped as \n, \t, ...
// so every row stays on one line. Columns are as wide as their widest value
// in terminal cells (wide CJK characters count 2). A Result with no columns
// prints only the row count.
func WriteTable(w io.Writer, r *Result) error {
	bw := bufio.NewWriter(w)
	if r == nil {
		r = &Result{}
	}
	header := make([]string, len(r.Columns))
	widths := make([]int, len(r.Columns))
	for i, c := range r.Columns {
		header[i] = escapeCell(c)
		widths[i] = displayWidth(header[i])
	}
	rows := make([][]string, len(r.Rows))
	for i, row := range r.Rows {
		cells := make([]string, len(r.Columns))
		for j := range cells {
			if j < len(row) {
				cells[j] = escapeCell(row[j])
			}
			if n := displayWidth(cells[j]); n > widths[j] {
				widths[j] = n
			}
		}
		rows[i] = cells
	}
	if len(r.Columns) > 0 {
		writeTableLine(bw, header, widths)
		for i, n := range widths {
			if i > 0 {
				bw.WriteByte('+')
			}
			bw.WriteString(strings.Repeat("-", n+2))
		}
		bw.WriteByte('\n')
		for _, cells := range rows {
			writeTableLine(bw, cells, widths)
		}
	}
	if len(r.Rows) == 1 {
		bw.WriteString("(1 row)\n")
	} else {
		fmt.Fprintf(bw, "(%d rows)\n", len(r.Rows))
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

func writeTableLine(bw *bufio.Writer, cells []string, widths []int) {
	for i, c := range cells {
		if i > 0 {
			bw.WriteString("|")
		}
		bw.WriteByte(' ')
		bw.WriteString(c)
		if i < len(cells)-1 {
			bw.WriteString(strings.Repeat(" ", widths[i]-displayWidth(c)+1))
		}
	}
	bw.WriteByte('\n')
}

// displayWidth is the number of terminal columns s takes: East Asian wide
// and fullwidth characters (CJK, Hangul, fullwidth forms, most emoji) count 2.
func displayWidth(s string) int {
	n := 0
	for _, r := range s {
		n++
		if isWide(r) {
			n++
		}
	}
	return n
}

func isWide(r rune) bool {
	switch {
	case r < 0x1100:
		return false
	case r <= 0x115f, // Hangul Jamo
		r >= 0x2e80 && r <= 0xa4cf && r != 0x303f, // CJK radicals .. Yi
		r >= 0xac00 && r <= 0xd7a3,                // Hangul syllables
		r >= 0xf900 && r <= 0xfaff,                // CJK compatibility ideographs
		r >= 0xfe30 && r <= 0xfe4f,                // CJK compatibility forms
		r >= 0xff00 && r <= 0xff60,                // fullwidth forms
		r >= 0xffe0 && r <= 0xffe6,
		r >= 0x1f300 && r <= 0x1f64f, // pictographs, emoticons
		r >= 0x1f900 && r <= 0x1f9ff,
		r >= 0x20000 && r <= 0x3fffd: // CJK extensions
		return true
	}
	return false
}

// escapeCell replaces control characters so that a value fits on one line.
func escapeCell(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			clean = false
			break
		}
	}
	if clean && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
		i += size
	}
	return b.String()
}
