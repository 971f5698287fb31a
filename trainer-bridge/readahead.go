package bridge

import (
	"context"

	"github.com/rollgate/rollgate/export"
)

// bulkChunk is how many rollouts Build reads per query from a bulk reader.
const bulkChunk = 500

// chunk is up to bulkChunk selected attempts and, from a bulk reader,
// the details of their rollouts, or why they could not be read.
type chunk struct {
	refs []AttemptRef
	m    map[string]*export.RolloutDetail
	err  error
}

// readAhead reads the rollouts of the chunks of attempts that refs hands
// out (none at the end), ahead of their consumer, with two queries in
// flight (the store prepares the next chunks while the bridge builds the
// samples of this one; a server with a core to spare runs both at once).
// It returns next, which hands out the chunks in order and false after the
// last one, after an error or when ctx ends. Each reader holds at most one
// chunk (read, or being read) until next takes it, so memory holds at most
// three chunks, one of them in use, and one list of attempts waiting for a
// reader. Once ctx ends, wait returns when refs is no longer called.
func readAhead(ctx context.Context, bulk export.BulkRolloutReader, refs func() ([]AttemptRef, error), ro export.ReadOptions) (next func() (chunk, bool), wait func()) {
	const readers = 2
	var jobs, lanes [readers]chan chunk
	for w := range lanes {
		jobs[w], lanes[w] = make(chan chunk), make(chan chunk)
		go func(jobs <-chan chunk, lane chan<- chunk) {
			defer close(lane)
			for c := range jobs {
				if c.err == nil {
					ids := make([]string, 0, len(c.refs))
					seen := map[string]bool{}
					for _, r := range c.refs {
						if !seen[r.RolloutID] {
							seen[r.RolloutID] = true
							ids = append(ids, r.RolloutID)
						}
					}
					c.m, c.err = bulk.Rollouts(ctx, ids, ro)
				}
				select {
				case lane <- c:
				case <-ctx.Done():
					return
				}
				if c.err != nil {
					return
				}
			}
		}(jobs[w], lanes[w])
	}
	// The lists of attempts, to the readers in turn.
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		defer func() {
			for _, j := range jobs {
				close(j)
			}
		}()
		for w := 0; ; w = (w + 1) % readers {
			rs, err := refs()
			if err == nil && len(rs) == 0 {
				return
			}
			select {
			case jobs[w] <- chunk{refs: rs, err: err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	k, failed := 0, false
	// The chunks in order: lane by lane in turn.
	return func() (chunk, bool) {
		if failed {
			return chunk{}, false
		}
		c, ok := <-lanes[k%readers]
		k++
		failed = !ok || c.err != nil
		return c, ok
	}, func() { <-fed }
}

// prefetched serves Rollout from a chunk read in bulk, and everything else
// from the store.
type prefetched struct {
	export.Store
	m map[string]*export.RolloutDetail
}

// Rollout returns the prefetched detail, or reads it when it is not there.
func (p *prefetched) Rollout(ctx context.Context, id string) (*export.RolloutDetail, error) {
	if d, ok := p.m[id]; ok {
		return d, nil
	}
	return p.Store.Rollout(ctx, id)
}
