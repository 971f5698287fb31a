package gateway

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestEngineAnswerChecks: what AgentCall.EngineAnswersOnly takes for an
// engine's answer, and the transport failures it names without their text.
func TestEngineAnswerChecks(t *testing.T) {
	for ct, want := range map[string]string{"application/json": "application/json", "Application/JSON; charset=utf-8": "application/json",
		"application/problem+json": "application/problem+json", "": "none", "text/html": "text/html",
		"text/html\"<b>secret</b>": "unusual", strings.Repeat("a", 70) + "/b": "unusual", "nonsense": "unusual"} {
		if got := mediaType([]byte(ct)); got != want {
			t.Errorf("mediaType(%q) = %q, want %q", ct, got, want)
		}
	}
	if !jsonContentType([]byte("application/json; charset=utf-8")) || !jsonContentType([]byte("application/vnd.x+json")) || jsonContentType([]byte("text/plain")) {
		t.Error("jsonContentType")
	}
	for body, want := range map[string]bool{`{"a":1}`: true, " \n{}\n": true, `[1]`: false, `{"a":`: false, ``: false, `<html>`: false, `"x"`: false} {
		if jsonObject([]byte(body)) != want {
			t.Errorf("jsonObject(%q) != %v", body, want)
		}
	}
	banner := errors.New(`error when reading response headers: cannot parse response status code: Response "SSH-2.0-secret\r\n"`)
	for err, want := range map[error]string{
		banner:                   "the answer is not valid HTTP",
		fasthttp.ErrTimeout:      "timed out",
		syscall.ECONNREFUSED:     "connection refused",
		io.ErrUnexpectedEOF:      "connection closed before a complete answer",
		fasthttp.ErrBodyTooLarge: "response body too large",
		fmt.Errorf("error when dialing 192.0.2.1:80: %w", syscall.EHOSTUNREACH): "could not connect",
	} {
		if got := transportFailure(err); got != want {
			t.Errorf("transportFailure(%v) = %q, want %q", err, got, want)
		}
	}
}
