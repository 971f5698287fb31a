package gateway

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/rollgate/rollgate/gateway/backends"
)

// enginePauser remembers the replicas whose engines POST /api/v1/pause?
// engine=MODE paused, so that /resume resumes those even when the routing
// table was replaced meanwhile.
type enginePauser struct {
	mu     sync.Mutex
	paused []*backends.Upstream
}

// PauseEngines calls the engines' own pause route in mode (see
// backends.EnginePause: vLLM's /pause?mode=, SGLang's /pause_generation) on
// every replica of the routing tables, each engine once, and returns what
// each answered. A replica whose kind has no pause route, or not this
// mode, is reported and skipped. An unknown mode is an error and nothing is
// paused.
func (s *Server) PauseEngines(mode string) ([]backends.EnginePauseResult, error) {
	if err := backends.CheckEngineMode(mode); err != nil {
		return nil, err
	}
	var reps []*backends.Upstream
	seen := map[string]bool{}
	for t := range s.tables() {
		for _, pl := range t.Pools() {
			for _, r := range pl.Replicas() {
				if !seen[r.Origin()+r.BasePath()] {
					seen[r.Origin()+r.BasePath()] = true
					reps = append(reps, r)
				}
			}
		}
	}
	results := s.engineCalls(reps, func(r *backends.Upstream, ep backends.EnginePause) (string, []byte, string) {
		if !slices.Contains(ep.Modes, mode) {
			return "", nil, fmt.Sprintf("kind %s has no pause mode %q (its modes: %v); not paused", r.Kind(), mode, ep.Modes)
		}
		path, body := ep.Request(mode)
		return path, body, ""
	})
	s.engines.mu.Lock()
	defer s.engines.mu.Unlock()
	for i, res := range results {
		results[i].Mode = mode
		if res.Status >= 200 && res.Status < 300 && !slices.Contains(s.engines.paused, reps[i]) {
			s.engines.paused = append(s.engines.paused, reps[i])
		}
	}
	s.log.Info("paused the engines", "mode", mode, "results", results)
	return results, nil
}

// ResumeEngines resumes the engines PauseEngines paused (vLLM's /resume,
// SGLang's /continue_generation) and returns what each answered; nil when
// none was paused.
func (s *Server) ResumeEngines() []backends.EnginePauseResult {
	s.engines.mu.Lock()
	reps := s.engines.paused
	s.engines.paused = nil
	s.engines.mu.Unlock()
	if len(reps) == 0 {
		return nil
	}
	results := s.engineCalls(reps, func(_ *backends.Upstream, ep backends.EnginePause) (string, []byte, string) {
		return ep.ResumePath, ep.ResumeBody, ""
	})
	s.log.Info("resumed the engines", "results", results)
	return results
}

// engineCalls sends each replica's request (req gives its path and body,
// or why none is sent) concurrently, bounded by PauseMaxHold (vLLM's mode
// wait answers once the engine drained), and returns the answers in order.
func (s *Server) engineCalls(reps []*backends.Upstream, req func(*backends.Upstream, backends.EnginePause) (path string, body []byte, skip string)) []backends.EnginePauseResult {
	results := make([]backends.EnginePauseResult, len(reps))
	deadline := time.Now().Add(s.cfg.PauseMaxHold)
	var wg sync.WaitGroup
	for i, r := range reps {
		res := &results[i]
		res.Replica, res.URL, res.Kind = r.Name(), r.Origin()+r.BasePath(), r.Kind().String()
		ep, ok := backends.EnginePauseOf(r.Kind())
		if !ok {
			res.Error = fmt.Sprintf("kind %s has no pause route; not paused", r.Kind())
			continue
		}
		path, body, skip := req(r, ep)
		if skip != "" {
			res.Error = skip
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, status, err := s.tokenInPost(r, r.Origin()+path, body, deadline, nil, nil)
			res.Status = status
			switch {
			case err != nil:
				res.Error = err.Error()
			case status == 404:
				res.Error = "the engine does not serve " + path + " (vLLM: start it with VLLM_SERVER_DEV_MODE=1)"
			case status >= 300:
				res.Error = truncate(string(out), 300)
			}
		}()
	}
	wg.Wait()
	return results
}
