package demo

import (
	"sync"
	"time"

	"github.com/lci-labs/compartment/internal/web"
)

// stage is what the dashboard shows of the story above the pools (its
// Scene): which phase runs and what it does to the database and the
// orders. Each phase sets it at every refresh from the numbers its
// terminal view draws, so the page and the terminal agree; during BEFORE,
// when the work runs in one shared asynq server the pools' cards cannot
// show, it is the page's view of the outage.
type stage struct {
	mu    sync.Mutex
	scene web.Scene
}

// Gauge keys of the demo's scene, drawn on the dashboard's timeline.
const (
	gaugeShared      = "shared_running"
	gaugeConnections = "connections"
	gaugeWaiting     = "orders_waiting"
	gaugeTimedOut    = "orders_timed_out"
	gaugeP99         = "order_p99_seconds"
	gaugeLimit       = "adaptive_limit"
	gaugeSlowdown    = "report_db_slowdown"
)

func (s *stage) get() web.Scene {
	s.mu.Lock()
	defer s.mu.Unlock()
	sc := s.scene
	sc.Gauges = append([]web.Gauge(nil), sc.Gauges...)
	return sc
}

// show sets the scene from a phase's live numbers: shared is the shared
// pool's size (0 for the walls, which have no shared pool), orderTimeout
// marks the waits and latencies that are trouble; extra gauges come
// last.
func (s *stage) show(title, status string, snap liveSnapshot, shared, dbInUse, dbMax, ordersPerSecond int, orderTimeout time.Duration, extra ...web.Gauge) {
	gauges := []web.Gauge{}
	if shared > 0 {
		gauges = append(gauges, web.Gauge{Key: gaugeShared, Label: "jobs in the shared pool", Value: float64(snap.rows[sharedRow].active), Max: float64(shared)})
	}
	gauges = append(gauges,
		web.Gauge{Key: gaugeConnections, Label: "database connections in use", Value: float64(dbInUse), Max: float64(dbMax), Alert: dbInUse >= dbMax},
		web.Gauge{Key: gaugeWaiting, Label: "orders waiting", Value: float64(snap.waiting), Alert: snap.waiting > ordersPerSecond},
		web.Gauge{Key: gaugeTimedOut, Label: "orders timed out (this phase)", Value: float64(snap.timedOut), Alert: snap.timedOut > 0},
		web.Gauge{Key: gaugeP99, Label: "order p99, last second (s)", Value: snap.recent.P99.Round(time.Millisecond).Seconds(), Alert: snap.recent.P99 >= orderTimeout/2},
	)
	gauges = append(gauges, extra...)
	s.mu.Lock()
	s.scene = web.Scene{Title: title, Note: status, Gauges: gauges}
	s.mu.Unlock()
}
