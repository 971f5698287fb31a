package gateway

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/gateway/backends"
)

// Error types in OpenAI-style error bodies.
const (
	errInvalidRequest = "invalid_request_error"
	errNotFound       = "not_found_error"
	errUpstream       = "upstream_error"
	errTimeout        = "timeout_error"
	errServer         = "server_error"
)

// appendError appends an OpenAI-style error body:
// {"error":{"message":...,"type":...,"param":null,"code":...}}.
func appendError(dst []byte, status int, typ, msg string) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = strconv.AppendQuote(dst, msg)
	dst = append(dst, `,"type":`...)
	dst = strconv.AppendQuote(dst, typ)
	dst = append(dst, `,"param":null,"code":`...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(dst, "}}"...)
	return dst
}

// AppendError appends the OpenAI-style error body every rollgate route
// answers with (the control plane's routes included).
func AppendError(dst []byte, status int, typ, msg string) []byte {
	return appendError(dst, status, typ, msg)
}

// upstreamStatus maps an error from a backend call to the status returned to
// the client: 504 on timeout, 502 otherwise (refused, reset, closed early).
func upstreamStatus(err error) (int, string) {
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrTimeout), errors.As(err, &ne) && ne.Timeout(), errors.Is(err, fasthttp.ErrDialTimeout), errors.Is(err, errUnacknowledged):
		return fasthttp.StatusGatewayTimeout, errTimeout
	case errors.Is(err, syscall.ECONNREFUSED), strings.Contains(err.Error(), "connection refused"):
		return fasthttp.StatusBadGateway, errUpstream
	}
	return fasthttp.StatusBadGateway, errUpstream
}

// retryable reports whether a failed backend call may be sent again: the
// connection failed before any response byte (refused, reset, closed early),
// or could not be made at all (a failed dial, timed out included: the
// request never left, as when the replica's host is cut off), or the
// request was never acknowledged by the replica's host (errUnacknowledged:
// a pooled connection to a host cut off since). Other timeouts are not
// retried: the engine may still be generating.
func retryable(err error) bool {
	var ne net.Error
	var dial *fasthttp.ErrDialWithUpstream
	if errors.As(err, &dial) || errors.Is(err, errUnacknowledged) {
		return true
	}
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) || (errors.As(err, &ne) && ne.Timeout()) {
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, fasthttp.ErrConnectionClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || strings.Contains(err.Error(), "connection refused") ||
		strings.Contains(err.Error(), "connection reset")
}

// staleConn reports whether a backend call failed because the replica had
// closed the connection before answering (the connection was closed, or
// gave EOF or a reset before the first response byte): what a pooled
// keep-alive connection that the server has since closed does.
func staleConn(err error) bool {
	return errors.Is(err, errUnacknowledged) || errors.Is(err, fasthttp.ErrConnectionClosed) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// transportFailure names the kind of a failed backend call without its
// text: fasthttp's errors quote what the other end sent (the first line of
// a non-HTTP answer, the buffer's contents), which a route serving
// endpoints the operator did not configure must not hand back.
func transportFailure(err error) string {
	var ne net.Error
	var oe *net.OpError
	switch {
	case errors.Is(err, errUnacknowledged):
		return "request not acknowledged by the replica's host"
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, fasthttp.ErrDialTimeout), errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	case errors.Is(err, syscall.ECONNREFUSED), strings.Contains(err.Error(), "connection refused"):
		return "connection refused"
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return "response body too large"
	case errors.As(err, &oe) && oe.Op == "dial", strings.Contains(err.Error(), "when dialing"):
		return "could not connect"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, fasthttp.ErrConnectionClosed), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF), strings.Contains(err.Error(), "connection reset"):
		return "connection closed before a complete answer"
	}
	return "the answer is not valid HTTP"
}

// unackedCause returns err, a call to replica r that failed before any
// response byte, as errUnacknowledged when it is what fasthttp made of one
// (a connection closed before the first byte, see idleConn) and r's host
// has just left a request unacknowledged; otherwise err unchanged. Both
// are retried the same way: this names the cause in the call's error and
// answers 504 rather than 502 when no retry is left.
func (s *Server) unackedCause(r *backends.Upstream, err error) error {
	if !errors.Is(err, fasthttp.ErrConnectionClosed) && !errors.Is(err, io.EOF) {
		return err
	}
	if !s.unreached.since(hostOf(r.Client().Addr), time.Now().Add(-time.Second)) {
		return err
	}
	return fmt.Errorf("%s: %w", r.Client().Addr, errUnacknowledged)
}
