package gateway

import (
	"unicode/utf8"
)

// Limits on the ids and names a call is attributed with. Rollout and attempt
// ids come from the path (/rollout/{r}/attempt/{a}/v1) or from headers and are
// echoed in response headers, logs and every stored row, so they are checked
// before any of that happens.
const (
	// MaxIDLen is the longest rollout or attempt id, in bytes.
	MaxIDLen = 128
	// MaxNameLen is the longest task id or agent name, in bytes.
	MaxNameLen = 256
)

// IDCharset describes the characters a rollout or attempt id may use, for
// error messages and documentation.
const IDCharset = "1-128 characters of A-Z a-z 0-9 and - _ . : @ + = ~"

// idChar marks the bytes allowed in rollout and attempt ids.
var idChar = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "-_.:@+=~" {
		t[c] = true
	}
	return t
}()

// ValidID reports whether b is a usable rollout or attempt id: 1 to MaxIDLen
// bytes of IDCharset. Such an id is safe in a URL path segment, an HTTP
// header, a log line and a SQL string literal.
func ValidID(b []byte) bool {
	if len(b) == 0 || len(b) > MaxIDLen {
		return false
	}
	for _, c := range b {
		if !idChar[c] {
			return false
		}
	}
	return true
}

// ValidName reports whether b is a usable task id or agent name: at most
// MaxNameLen bytes of valid UTF-8 without control characters (C0, DEL, C1),
// so it cannot split a header or a log line. The empty name is valid (absent).
func ValidName(b []byte) bool {
	if len(b) > MaxNameLen {
		return false
	}
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError || (r >= 0x80 && r <= 0x9f) || r == 0x2028 || r == 0x2029 {
			return false
		}
		i += n
	}
	return true
}

// attributionError says what is wrong with a call's attribution, or "" when
// it is usable. The message names the offending field, never its value.
func attributionError(a attribution, fromPath bool) string {
	where := "header x-rollout-id"
	if fromPath {
		where = "path /rollout/{rollout_id}/attempt/{attempt_id}"
	}
	switch {
	case len(a.rolloutID) > 0 && !ValidID(a.rolloutID):
		return "invalid rollout id in the " + where + ": use " + IDCharset
	case len(a.rolloutID) > 0 && len(a.attemptID) > 0 && !ValidID(a.attemptID):
		return "invalid attempt id in the " + where + ": use " + IDCharset
	case len(a.rolloutID) == 0 && len(a.attemptID) > 0:
		return "header x-attempt-id given without x-rollout-id: send both, or use the base URL /rollout/{rollout_id}/attempt/{attempt_id}/v1"
	case !ValidName(a.taskID):
		return "invalid header x-task-id: at most 256 bytes of UTF-8 without control characters"
	case !ValidName(a.agentName):
		return "invalid header x-agent-name: at most 256 bytes of UTF-8 without control characters"
	}
	return ""
}
