package gateway

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollgate/rollgate/gateway/backends"
)

// replicaHealth exports whether each replica is in selection, read at
// scrape time: rollgate_backend_healthy{backend} is 1, or 0 while the
// replica is out of selection (--unhealthy-after failures in a row, calls
// or health checks, for --unhealthy-cooldown). A replica cut off from the
// gateway shows nowhere else: its calls are retried on the others and
// its cut streams answered 200 before they broke.
type replicaHealth struct {
	set  *backends.Set
	desc *prometheus.Desc
}

func newReplicaHealth(set *backends.Set) *replicaHealth {
	return &replicaHealth{set: set, desc: prometheus.NewDesc("rollgate_backend_healthy",
		"Whether a backend replica is in selection: 1, or 0 while it is out after --unhealthy-after failures in a row (calls that could not connect or got no answer, streams that stalled or broke off, health checks) for --unhealthy-cooldown.",
		[]string{"backend"}, nil)}
}

// Describe implements prometheus.Collector.
func (h *replicaHealth) Describe(ch chan<- *prometheus.Desc) { ch <- h.desc }

// Collect implements prometheus.Collector.
func (h *replicaHealth) Collect(ch chan<- prometheus.Metric) {
	// One sample per name: replicas of several pools may share one (0 if
	// any of them is out of selection).
	healthy := map[string]float64{}
	for _, p := range h.set.Load().Pools() {
		for _, u := range p.Replicas() {
			v, seen := healthy[u.Name()]
			if !seen {
				v = 1
			}
			if !u.Healthy() {
				v = 0
			}
			healthy[u.Name()] = v
		}
	}
	for name, v := range healthy {
		ch <- prometheus.MustNewConstMetric(h.desc, prometheus.GaugeValue, v, name)
	}
}

// registerReplicaHealth registers the replicas' health gauge on reg; a
// registry that has it already (a second server on the same metrics, in
// tests) keeps the first.
func registerReplicaHealth(reg *prometheus.Registry, set *backends.Set) error {
	var already prometheus.AlreadyRegisteredError
	if err := reg.Register(newReplicaHealth(set)); err != nil && !errors.As(err, &already) {
		return err
	}
	return nil
}
