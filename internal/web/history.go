package web

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/queues"
)

// Defaults of the dashboard's timeline.
const (
	// DefaultHistoryWindow is how far back the timeline reaches.
	DefaultHistoryWindow = 15 * time.Minute
	// DefaultHistoryEvery is how often the timeline takes a sample.
	DefaultHistoryEvery = 2 * time.Second
	// maxWaitsPerSample bounds the waits one tier keeps between two
	// samples: beyond it, the newest replace older ones at random places
	// (a reservoir), so a flood costs no more memory than a trickle.
	maxWaitsPerSample = 2048
)

// History is the dashboard's timeline, kept in the worker's memory: one
// sample every Every over the last Window of each pool's running jobs
// against its size in effect, the jobs taken ahead of a slot, its backlog
// and its jobs done per second (all read from Redis, so across every
// worker process), and per tier the 95th percentile of the waits of the
// jobs that started in this process since the sample before; plus the
// gauges of the Scene, if any, with its title as the phase.
//
// A History is a queues.Observer: give it to the client (Config.Observer,
// app.WorkerOptions.Observer) so it hears the waits; it passes every event
// on to Next. It is safe for concurrent use.
type History struct {
	// Next is told every event after the history (metrics, say). Optional.
	Next queues.Observer
	// Every is the time between samples. Defaults to DefaultHistoryEvery.
	Every time.Duration
	// Window is how long samples are kept. Defaults to
	// DefaultHistoryWindow.
	Window time.Duration

	mu      sync.Mutex
	waits   map[poolTier]*waitSet
	samples []Sample
	last    map[string]int64 // each pool's processed count at the last sample
	lastAt  time.Time
}

type poolTier struct{ pool, tier string }

// waitSet holds the waits of one tier since the last sample.
type waitSet struct {
	seen int
	d    []float64 // seconds
}

func (w *waitSet) add(seconds float64) {
	w.seen++
	if len(w.d) < maxWaitsPerSample {
		w.d = append(w.d, seconds)
		return
	}
	// Algorithm R: each of the seen waits is kept with equal chance.
	if i := int(uint64(time.Now().UnixNano()) % uint64(w.seen)); i < maxWaitsPerSample {
		w.d[i] = seconds
	}
}

// Sample is one point of the timeline.
type Sample struct {
	// At is when it was taken, in Unix milliseconds.
	At int64 `json:"at"`
	// Phase is the Scene's title then ("" without a scene).
	Phase string       `json:"phase,omitempty"`
	Pools []PoolSample `json:"pools"`
	// Gauges are the Scene's gauges then, by key.
	Gauges map[string]float64 `json:"gauges,omitempty"`
}

// PoolSample is one pool in a Sample.
type PoolSample struct {
	Pool string `json:"pool"`
	// Running and Size: jobs whose handler runs, and the slots the pool
	// has (app.PoolStatus Active and Capacity: the size in effect for a
	// cluster-scoped pool, size times worker processes otherwise).
	Running int64 `json:"running"`
	Size    int64 `json:"size"`
	// ForSlot counts the jobs taken ahead of a free slot; Backlog the
	// jobs pending, scheduled or waiting for a retry.
	ForSlot int64 `json:"for_slot"`
	Backlog int64 `json:"backlog"`
	// DonePerSecond is the jobs processed (succeeded or failed, by every
	// process) per second since the sample before; -1 for the first.
	DonePerSecond float64 `json:"done_per_second"`
	// WaitP95 gives, per tier ("" for a pool without tiers), the 95th
	// percentile in seconds of the waits of the jobs that started in this
	// process since the sample before; a tier where none started is
	// absent.
	WaitP95 map[string]float64 `json:"wait_p95,omitempty"`
}

var _ queues.Observer = (*History)(nil)

// JobStarted implements queues.Observer.
func (h *History) JobStarted(s queues.JobStart) {
	if s.WaitKnown {
		h.mu.Lock()
		if h.waits == nil {
			h.waits = map[poolTier]*waitSet{}
		}
		k := poolTier{s.Pool, s.Tier}
		w := h.waits[k]
		if w == nil {
			w = &waitSet{}
			h.waits[k] = w
		}
		w.add(s.Wait.Seconds())
		h.mu.Unlock()
	}
	if h.Next != nil {
		h.Next.JobStarted(s)
	}
}

// JobFinished implements queues.Observer.
func (h *History) JobFinished(e queues.JobEnd) {
	if h.Next != nil {
		h.Next.JobFinished(e)
	}
}

func (h *History) every() time.Duration  { return cmp.Or(h.Every, DefaultHistoryEvery) }
func (h *History) window() time.Duration { return cmp.Or(h.Window, DefaultHistoryWindow) }

// record adds a sample taken at now from st (and the scene's state, nil
// without one) and drops the samples older than the window.
func (h *History) record(now time.Time, st app.Status, scene *Scene) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := Sample{At: now.UnixMilli()}
	if scene != nil {
		s.Phase = scene.Title
		s.Gauges = map[string]float64{}
		for _, g := range scene.Gauges {
			s.Gauges[g.Key] = g.Value
		}
	}
	processed := map[string]int64{}
	for _, p := range st.Pools {
		ps := PoolSample{Pool: p.Name, Running: int64(p.Active), Size: int64(p.Capacity), ForSlot: int64(p.WaitingForSlot),
			Backlog: int64(p.Backlog), DonePerSecond: -1}
		for _, q := range p.Queues {
			processed[p.Name] += q.Processed
			if w := h.waits[poolTier{p.Name, q.Tier}]; w != nil && len(w.d) > 0 {
				if ps.WaitP95 == nil {
					ps.WaitP95 = map[string]float64{}
				}
				ps.WaitP95[q.Tier] = percentile(w.d, 0.95)
			}
		}
		if before, ok := h.last[p.Name]; ok && now.After(h.lastAt) {
			ps.DonePerSecond = float64(max(0, processed[p.Name]-before)) / now.Sub(h.lastAt).Seconds()
		}
		s.Pools = append(s.Pools, ps)
	}
	h.last, h.lastAt = processed, now
	h.waits = nil
	h.samples = append(h.samples, s)
	cut := 0
	for cut < len(h.samples) && now.Sub(time.UnixMilli(h.samples[cut].At)) > h.window() {
		cut++
	}
	h.samples = slices.Delete(h.samples, 0, cut)
}

// Samples returns a copy of the samples kept, oldest first.
func (h *History) Samples() []Sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.samples)
}

// percentile returns the p-th percentile of d (nearest rank); d is
// sorted in place.
func percentile(d []float64, p float64) float64 {
	slices.Sort(d)
	i := int(float64(len(d))*p+0.5) - 1
	return d[min(max(i, 0), len(d)-1)]
}

// sample reads the pools' state and the scene, and records them.
func (s *Server) sample(ctx context.Context) {
	h := s.o.History
	e := s.o.Enqueuer
	ctx, cancel := context.WithTimeout(ctx, h.every())
	defer cancel()
	st, err := e.Status(ctx)
	if err != nil {
		s.o.Logger.Debug("http: timeline sample", "error", err)
		return
	}
	var scene *Scene
	if s.o.Scene != nil {
		sc := s.o.Scene()
		scene = &sc
	}
	h.record(time.Now(), st, scene)
}

// sampleLoop takes a sample every History.Every until ctx ends.
func (s *Server) sampleLoop(ctx context.Context) {
	t := time.NewTicker(s.o.History.every())
	defer t.Stop()
	s.sample(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.sample(ctx)
		}
	}
}
