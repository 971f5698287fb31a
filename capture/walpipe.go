package capture

import (
	"sync"
	"time"
)

// walBuf is a record encoding buffer and its scratch, pooled.
type walBuf struct {
	b []byte
	s walScratch
	a Assembler // a non-streamed response's assembly, for a rows record
}

var walBufs = sync.Pool{New: func() any { return new(walBuf) }}

// AcquirePending is the package's AcquirePending for calls this pipeline
// will capture: with a WAL, the Pending keeps a stream's payloads for its
// record.
func (p *Pipeline) AcquirePending() *Pending {
	c := AcquirePending()
	c.keepRaw = p.cfg.WAL != nil
	return c
}

// Logging reports whether calls are logged to a WAL (Config.WAL).
func (p *Pipeline) Logging() bool { return p.cfg.WAL != nil }

// Commit logs the finished call c to the WAL with one write(2), unless
// there is no WAL or Commit ran for c already (logged or refused). The gateway calls it for a stream
// before the stream's last bytes go to the client; TryPush calls it for
// every other call. It never blocks on the store: a full WAL or a failed
// write is counted (rollgate_capture_wal_skipped_total) and c goes on
// unlogged. c is not retained.
func (p *Pipeline) Commit(c *Pending) {
	w := p.cfg.WAL
	if w == nil || c.walTried {
		return
	}
	c.walTried = true // once: after a refusal the payloads are gone
	if c.Meta.EndTimeUnixNano == 0 {
		c.Meta.EndTimeUnixNano = uint64(time.Now().UnixNano())
	}
	wb := walBufs.Get().(*walBuf)
	if p.cfg.Redact.active() {
		// Nothing the rules keep out of the store reaches the disk: the
		// record holds the redacted rows, not the raw call.
		wb.b = appendWALRows(wb.b[:0], c, &wb.a, p.cfg.Redact, &wb.s)
	} else {
		wb.b = appendWALRecord(wb.b[:0], c, &wb.s)
	}
	ref, err := w.append(wb.b)
	if cap(wb.b) <= 1<<20 && cap(wb.s.meta) <= 1<<20 && wb.a.footprint() <= 1<<20 {
		walBufs.Put(wb)
	}
	if err == nil {
		c.wal, c.walLogged = ref, true
	}
	// The payloads were kept for the record only: free them before the
	// call waits in the queue (they would count against QueueBytes).
	c.raw, c.rawEnds, c.keepRaw = c.raw[:0], c.rawEnds[:0], false
}

// ReplayWAL feeds the calls an earlier process logged to the WAL but never
// stored (it was killed) into the pipeline, in the order they were logged,
// waiting for room in the queue; their rows are written with
// export.WriteAgain, so a store with export.OnceWriter keeps each row once.
// Call it once, after the pipeline's fallback and checks are set; it
// returns when every record is queued or the pipeline is closed.
func (p *Pipeline) ReplayWAL() error {
	w := p.cfg.WAL
	if w == nil {
		return nil
	}
	defer p.replay.end.Do(func() { close(p.replay.channel()) })
	n := 0
	err := w.replay(func(ref walRef, payload []byte) bool {
		c := AcquirePending()
		if err := decodeWALRecord(payload, c); err != nil {
			releasePending(c)
			w.setAside(ref, err)
			return true
		}
		c.wal, c.walLogged, c.walTried, c.again = ref, true, true, true
		for !p.enqueue(c) {
			select {
			case <-p.quit:
				releasePending(c)
				return false
			case <-time.After(5 * time.Millisecond): // the queue is full: let the workers take some
			}
		}
		n++
		return true
	})
	if n > 0 {
		p.log.Info("capture WAL: calls of an earlier run queued for capture again", "calls", n)
	}
	return err
}

// replayState tells when ReplayWAL has queued an earlier run's calls.
type replayState struct {
	make, end sync.Once
	ch        chan struct{}
}

func (r *replayState) channel() chan struct{} {
	r.make.Do(func() { r.ch = make(chan struct{}) })
	return r.ch
}

// closedChan is a channel that is always closed.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Replayed is closed once ReplayWAL has queued every call an earlier run
// logged to the WAL (at once when there is no WAL), so that a reader that
// must see every answered call (Sync after it) does not read before the
// replay of a killed run's calls.
func (p *Pipeline) Replayed() <-chan struct{} {
	if p.cfg.WAL == nil {
		return closedChan
	}
	return p.replay.channel()
}
