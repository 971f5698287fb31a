package gateway

import "time"

// healthLoop checks every replica actively until stop closes.
func (s *Server) healthLoop(stop <-chan struct{}) {
	if s.cfg.HealthInterval < 0 {
		return
	}
	t := time.NewTicker(s.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for _, p := range s.table.Load().allPools() {
			for _, r := range p.replicas {
				if r.checkHealth(2 * time.Second) {
					r.markSuccess()
				} else {
					r.markFailure(s.cfg.UnhealthyAfter, s.cfg.UnhealthyCooldown)
				}
			}
		}
	}
}
