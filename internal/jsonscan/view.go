package jsonscan

import "unsafe"

// String views b as a string without copying. The string must not outlive
// b's contents, and b must not change while the string is in use: copy
// whatever is kept.
func String(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// Bytes views s as bytes without copying. The bytes must not be modified.
func Bytes(s string) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// Offset returns where sub starts in s, when sub is a substring of s's own
// bytes (a slice of it, not an equal string elsewhere); -1 otherwise.
func Offset(s, sub string) int {
	if len(sub) == 0 || len(sub) > len(s) {
		return -1
	}
	off := uintptr(unsafe.Pointer(unsafe.StringData(sub))) - uintptr(unsafe.Pointer(unsafe.StringData(s)))
	if off > uintptr(len(s)-len(sub)) {
		return -1
	}
	return int(off)
}
