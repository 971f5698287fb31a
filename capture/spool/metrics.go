package spool

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// collectors are the spool's Prometheus metrics, labelled with the sink's name.
type collectors struct {
	bytes          prometheus.Gauge
	records        prometheus.Gauge
	maxBytes       prometheus.Gauge
	spilledRows    prometheus.Counter
	replayedRows   prometheus.Counter
	droppedRows    prometheus.Counter
	corruptRecords prometheus.Counter
	replayErrors   prometheus.Counter
	replayWrites   prometheus.Counter
	full           prometheus.Counter
}

func newCollectors(reg prometheus.Registerer, sink string) (*collectors, error) {
	labels := prometheus.Labels{"sink": sink}
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	m := &collectors{
		bytes:          g("rollgate_spool_bytes", "Bytes of spooled records not yet acknowledged by the sink."),
		records:        g("rollgate_spool_records", "Spooled batches not yet acknowledged by the sink."),
		maxBytes:       g("rollgate_spool_max_bytes", "Configured spool capacity in bytes (--spool-max-bytes)."),
		spilledRows:    c("rollgate_spool_spilled_rows_total", "Rows written to the spool because the sink failed, was slow, or earlier rows were still spooled."),
		replayedRows:   c("rollgate_spool_replayed_rows_total", "Spooled rows the sink acknowledged on replay."),
		droppedRows:    c("rollgate_spool_dropped_rows_total", "Rows refused because the spool was full (policy drop) or a record exceeded the capacity, or lost in a damaged record (when its rows can be told)."),
		corruptRecords: c("rollgate_spool_corrupt_records_total", "Damaged records or regions found at recovery (torn, failing their checksum, bad length or magic) or undecodable at replay: set aside in a quarantine file beside their segment, the records after them kept."),
		replayErrors:   c("rollgate_spool_replay_errors_total", "Failed attempts to write a spooled batch to the sink."),
		replayWrites:   c("rollgate_spool_replay_writes_total", "Replay writes the sink acknowledged; each carries up to 256 spooled batches or 8 MiB (the defaults) (rollgate_spool_replayed_rows_total / this = rows per write)."),
		full:           c("rollgate_spool_full_total", "Writes that found the spool full (and then waited or were dropped, per the full policy)."),
	}
	if reg == nil {
		return m, nil
	}
	for _, col := range []prometheus.Collector{m.bytes, m.records, m.maxBytes, m.spilledRows, m.replayedRows,
		m.droppedRows, m.corruptRecords, m.replayErrors, m.replayWrites, m.full} {
		if err := reg.Register(col); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("spool: metrics for sink %q already registered (one spool per sink name): %w", sink, err)
			}
			return nil, fmt.Errorf("spool: register metrics: %w", err)
		}
	}
	return m, nil
}
