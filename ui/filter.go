package ui

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxFilterLen bounds one filter value (ids, names, versions).
const maxFilterLen = 512

// checkValue says why s cannot be a filter value, or returns nil.
func checkValue(what, s string) error {
	switch {
	case len(s) > maxFilterLen:
		return fmt.Errorf("%s is longer than %d bytes", what, maxFilterLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("%s is not valid UTF-8", what)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%s contains a NUL byte", what)
	}
	return nil
}

// u64 renders n in decimal.
func u64(n uint64) string { return strconv.FormatUint(n, 10) }
