package capture

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// TestSSEScannerLetsGoOfALargeEvent: a stream whose first event is large
// (vLLM's first chunk carries prompt_token_ids: ~150 KB of JSON for a
// 25k-token prompt) and whose other events are small does not keep the
// large buffers for the rest of its life: after the large event, the
// scanner's buffers fall back under streamRetain. Before, both its byte
// buffer and its data buffer kept the large event's capacity until the
// stream ended (the live heap of 32 open streams of a 100 KB prompt
// through the mock: 30 MB in SSEScanner.Feed and SSEScanner.field).
// Every byte is still returned, in order.
func TestSSEScannerLetsGoOfALargeEvent(t *testing.T) {
	var s SSEScanner
	var in, out bytes.Buffer
	large := "data: {\"prompt_token_ids\":[" + strings.Repeat("12345,", 100_000) + "1]}\n\n"
	in.WriteString(large)
	for i := range 200 {
		fmt.Fprintf(&in, "data: {\"choices\":[{\"delta\":{\"content\":\"token %d\"}}]}\n\n", i)
	}
	stream := in.Bytes()
	events := 0
	for off := 0; off < len(stream); off += 4096 { // reads of 4 KiB, as the stream's
		s.Feed(stream[off:min(off+4096, len(stream))])
		if events > 1 && (cap(s.buf) > streamRetain || cap(s.data) > streamRetain) {
			t.Fatalf("%d events after the large one, the scanner holds buffers of %d and %d bytes, want at most %d", events-1, cap(s.buf), cap(s.data), streamRetain)
		}
		for {
			ev, ok := s.Next()
			if !ok {
				break
			}
			out.Write(ev.Raw)
			events++
		}
	}
	if ev, ok := s.Finish(); ok || len(ev.Raw) > 0 {
		t.Fatalf("bytes left after the last event: %q", ev.Raw)
	}
	if events != 201 || !bytes.Equal(out.Bytes(), stream) {
		t.Fatalf("%d events, %d of %d bytes returned: want 201 events giving back the stream", events, out.Len(), len(stream))
	}
}
