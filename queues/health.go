package queues

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// health turns the pools' periodic Redis pings into two log lines: one when
// Redis stops answering, one when it answers again, instead of an error per
// failed dequeue.
type health struct {
	log *slog.Logger

	mu    sync.Mutex
	down  bool
	since time.Time

	downFlag atomic.Bool // down, read without the lock on every job's end
}

// isDown says whether the last report was a failure.
func (h *health) isDown() bool { return h.downFlag.Load() }

func (h *health) report(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.downFlag.Store(err != nil)
	switch {
	case err != nil && !h.down:
		h.down, h.since = true, time.Now()
		h.log.Error("redis unreachable; pools keep their jobs and retry until it is back", "error", err)
	case err == nil && h.down:
		h.down = false
		h.log.Info("redis reachable again; pools resume", "down_for", time.Since(h.since).Round(time.Second))
	}
}
