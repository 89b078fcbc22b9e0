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

	mu    sync.Mutex  // one report at a time, so each change logs once
	down  atomic.Bool // the last report was a failure; read on every job's end
	since time.Time
}

// isDown says whether the last report was a failure.
func (h *health) isDown() bool { return h.down.Load() }

func (h *health) report(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	was := h.down.Swap(err != nil)
	switch {
	case err != nil && !was:
		h.since = time.Now()
		h.log.Error("redis unreachable; pools keep their jobs and retry until it is back", "error", err)
	case err == nil && was:
		h.log.Info("redis reachable again; pools resume", "down_for", time.Since(h.since).Round(time.Second))
	}
}
