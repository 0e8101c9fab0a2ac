package pebblestore

import (
	"context"

	"go.opentelemetry.io/otel/metric"
)

const instrumentationName = "github.com/tidemq/tidemq/pebblestore"

// registerMetrics gives mp the store's gauges: Pebble's health and what
// each storage trick did (doc.go, "Storage tricks"). A trick turned off
// reports 0. Close unregisters them.
func (s *Store) registerMetrics(mp metric.MeterProvider) error {
	if mp == nil {
		return nil
	}
	m := mp.Meter(instrumentationName)
	var err error
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		if err != nil {
			return nil
		}
		var g metric.Int64ObservableGauge
		g, err = m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return g
	}
	l0 := gauge("tidemq.store.l0.sublevels", "{sublevel}", "Pebble L0 sublevels (read amplification).")
	stalls := gauge("tidemq.store.write_stalls", "{stall}", "Pebble write stalls since start.")
	uringSyncs := gauge("tidemq.store.wal.uring_syncs", "{sync}", "WAL fdatasyncs since start run by a kernel worker through io_uring (the rest are plain syscalls).")
	spares := gauge("tidemq.store.wal.spares_used", "{file}", "WAL files since start that were zero-filled spares (their syncs write no inode) instead of new or short files.")
	polledCommits := gauge("tidemq.store.wal.polled_commits", "{commit}", "Synced commits since start that waited for their WAL sync by polling (lone sends, while no other goroutine wanted the CPU) instead of parking.")
	if err != nil {
		return err
	}
	s.metrics, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s.mu.RLock()
		defer s.mu.RUnlock()
		if s.closed {
			return nil
		}
		o.ObserveInt64(l0, int64(s.db.Metrics().Levels[0].Sublevels))
		o.ObserveInt64(stalls, s.writeStalls.Load())
		o.ObserveInt64(uringSyncs, s.ring.syncs())
		o.ObserveInt64(spares, s.spares.taken())
		o.ObserveInt64(polledCommits, s.polledCommits())
		return nil
	}, l0, stalls, uringSyncs, spares, polledCommits)
	return err
}

// polledCommits counts the synced commits that waited for their WAL sync
// by polling (commitPolling).
func (s *Store) polledCommits() int64 {
	if s.walSyncs == nil {
		return 0
	}
	return s.walSyncs.polled.Load()
}
