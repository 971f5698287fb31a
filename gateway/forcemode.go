package gateway

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/gateway/rewrite"
)

// maxRolloutModes bounds the rollouts whose mode the gateway remembers
// (SetRolloutMode); past it the memory starts over.
const maxRolloutModes = 1 << 20

// forceModes are Config.ForceModes: per rollout mode ("train", "val"), the
// forced fields, each set merged over Config.Force.
type forceModes struct {
	sets  map[string]*rewrite.ForceSet
	modes atomic.Pointer[sync.Map] // rollout_id → mode
	n     atomic.Int64
}

// newForceModes builds the per-mode sets; base is Config.Force.
func newForceModes(base map[string]any, modes map[string]map[string]any) (*forceModes, error) {
	fm := &forceModes{sets: map[string]*rewrite.ForceSet{}}
	fm.modes.Store(new(sync.Map))
	names := make([]string, 0, len(modes))
	for m := range modes {
		names = append(names, m)
	}
	sort.Strings(names)
	for _, m := range names {
		merged := map[string]any{}
		for k, v := range base {
			merged[k] = v
		}
		for k, v := range modes[m] {
			merged[k] = v
		}
		fs, err := rewrite.ForceMap(merged)
		if err != nil {
			return nil, fmt.Errorf("force_modes.%s: %w", m, err)
		}
		fm.sets[m] = fs
	}
	return fm, nil
}

// SetRolloutMode records a rollout's mode ("train" or "val", as the task
// queue knows it), which selects its calls' forced fields
// (Config.ForceModes) when they carry no x-rollout-mode header.
func (s *Server) SetRolloutMode(rolloutID, mode string) {
	fm := s.forceModes
	if fm == nil || rolloutID == "" {
		return
	}
	if fm.n.Add(1) > maxRolloutModes {
		fm.modes.Store(new(sync.Map))
		fm.n.Store(1)
	}
	fm.modes.Load().Store(rolloutID, mode)
}

// forceFor returns the forced fields of a call on the gateway's own routes:
// its mode's set (the x-rollout-mode header, else the mode recorded for
// its rollout) or Config.Force.
func (s *Server) forceFor(ctx *fasthttp.RequestCtx, attr attribution) *rewrite.ForceSet {
	fm := s.forceModes
	if fm == nil {
		return s.force
	}
	if h := ctx.Request.Header.Peek("x-rollout-mode"); len(h) > 0 {
		if fs := fm.sets[string(h)]; fs != nil {
			return fs
		}
		return s.force
	}
	if len(attr.rolloutID) > 0 {
		if v, ok := fm.modes.Load().Load(string(attr.rolloutID)); ok {
			if fs := fm.sets[v.(string)]; fs != nil {
				return fs
			}
		}
	}
	return s.force
}
