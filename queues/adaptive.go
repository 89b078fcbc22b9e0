package queues

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// AdaptiveConfig makes a cluster-scoped pool's size in effect move with
// the latency of its jobs (docs/DEPENDENCIES.md): every Window the engine
// compares the jobs that succeeded in the last window, their time working and
// waiting for their dependencies (DependencyHandle.Acquire), with their
// recent baseline. When they are slower than Tolerance times the baseline
// the limit falls in proportion (by at most half per window); when they
// spent over a quarter of their time waiting for a dependency it falls by
// a quarter; when they are back within tolerance and the pool is full it
// climbs by the square root of the limit, up to MaxSize. The limit lives
// in Redis and holds across every worker process, as Client.Resize does,
// and an operator's Resize overrides it until ResetSize.
type AdaptiveConfig struct {
	// Min is the lowest the limit falls: at least 1, at most the pool's
	// MaxSize, and above its reserved slots. Required.
	Min int `json:"min"`
	// Window is how often the limit is decided, from the jobs that ended
	// in the window before. Defaults to 2s; at least MinAdaptiveWindow.
	Window time.Duration `json:"window,omitempty"`
	// Tolerance is how much slower than their baseline the jobs may get
	// before the limit falls. Defaults to 1.5; above 1.
	Tolerance float64 `json:"tolerance,omitempty"`
}

const (
	// DefaultAdaptiveWindow is AdaptiveConfig.Window's default.
	DefaultAdaptiveWindow = 2 * time.Second
	// MinAdaptiveWindow is the shortest AdaptiveConfig.Window.
	MinAdaptiveWindow = 100 * time.Millisecond
	// DefaultAdaptiveTolerance is AdaptiveConfig.Tolerance's default.
	DefaultAdaptiveTolerance = 1.5
)

func (a *AdaptiveConfig) withDefaults() *AdaptiveConfig {
	if a == nil {
		return nil
	}
	c := *a
	if c.Window == 0 {
		c.Window = DefaultAdaptiveWindow
	}
	if c.Tolerance == 0 {
		c.Tolerance = DefaultAdaptiveTolerance
	}
	return &c
}

// adaptiveProblems checks the pool's adaptive settings (defaults filled).
func (p PoolConfig) adaptiveProblems(label string) []string {
	a := p.Adaptive
	if a == nil {
		return nil
	}
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if p.Scope != ScopeCluster {
		add("%s: adaptive needs scope: cluster (the limit holds across every worker process, in Redis)", label)
	}
	reserved := 0
	for _, n := range p.Reserved {
		reserved += n
	}
	switch {
	case a.Min < 1:
		add("%s: adaptive: min must be >= 1, got %d", label, a.Min)
	case p.Scope == ScopeCluster && a.Min > p.MaxSize:
		add("%s: adaptive: min (%d) must be at most max_size (%d)", label, a.Min, p.MaxSize)
	case reserved > 0 && a.Min <= reserved:
		add("%s: adaptive: min (%d) must be more than the pool's %d reserved slots (reserved slots never shrink)", label, a.Min, reserved)
	}
	if a.Window < MinAdaptiveWindow {
		add("%s: adaptive: window must be at least %s, got %s", label, MinAdaptiveWindow, a.Window)
	}
	if !(a.Tolerance > 1) {
		add("%s: adaptive: tolerance must be above 1, got %g", label, a.Tolerance)
	}
	return out
}

// adaptiveSamples gathers, per adaptive pool, what this process saw of
// its jobs since the pool's last tick.
type adaptiveSamples struct {
	mu  sync.Mutex
	acc map[string]*rdb.AdaptiveSample
	// next is each pool's next tick.
	next map[string]time.Time
	// skipped counts, per pool with dependencies, its succeeded jobs that
	// took no share while none did (see skip); sampled says one did.
	skipped map[string]int
	sampled map[string]bool
}

// adaptiveSkipWarn is how many succeeded jobs of an adaptive pool with
// dependencies may take no share, and none take one, before the process
// warns that the limit has nothing to follow.
const adaptiveSkipWarn = 100

// skip counts a succeeded job of pool left out of the samples, and says
// whether to warn now (once, at the adaptiveSkipWarn-th, when none of the
// pool's jobs was sampled in this process).
func (s *adaptiveSamples) skip(pool string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sampled[pool] {
		return false
	}
	if s.skipped == nil {
		s.skipped = map[string]int{}
	}
	s.skipped[pool]++
	return s.skipped[pool] == adaptiveSkipWarn
}

func (s *adaptiveSamples) record(pool string, work, wait time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.acc == nil {
		s.acc = map[string]*rdb.AdaptiveSample{}
	}
	a := s.acc[pool]
	if a == nil {
		a = &rdb.AdaptiveSample{}
		s.acc[pool] = a
	}
	if s.sampled == nil {
		s.sampled = map[string]bool{}
	}
	s.sampled[pool] = true
	a.Jobs++
	a.Work += max(0, work)
	a.Wait += max(0, wait)
}

func (s *adaptiveSamples) take(pool string) rdb.AdaptiveSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.acc[pool]
	if a == nil {
		return rdb.AdaptiveSample{}
	}
	delete(s.acc, pool)
	return *a
}

// adaptiveTick is how often the runner's adaptive loop looks for a pool
// whose tick is due.
const adaptiveTick = 50 * time.Millisecond

// adaptiveLoop ticks every adaptive pool once a Window until ctx ends:
// it reports what this process saw and, in the first process to tick in a
// window, decides the limit (lua/adaptive_tick.lua).
func (r *runner) adaptiveLoop(ctx context.Context) {
	t := time.NewTicker(adaptiveTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		for _, p := range r.c.pools().pools {
			a := p.cfg.Adaptive
			if a == nil || p.Scope() != ScopeCluster {
				continue
			}
			r.adaptive.mu.Lock()
			if r.adaptive.next == nil {
				r.adaptive.next = map[string]time.Time{}
			}
			due := r.adaptive.next[p.Name()]
			if now.Before(due) {
				r.adaptive.mu.Unlock()
				continue
			}
			r.adaptive.next[p.Name()] = now.Add(a.Window)
			r.adaptive.mu.Unlock()
			r.tickAdaptive(ctx, p)
		}
	}
}

// tickAdaptive runs one tick of p's adaptive limit. A tick that fails
// (Redis down) loses its sample, which only delays the next decision.
func (r *runner) tickAdaptive(ctx context.Context, p *Pool) {
	a := p.cfg.Adaptive
	s := r.adaptive.take(p.Name())
	tctx, cancel := context.WithTimeout(ctx, a.Window)
	defer cancel()
	d, err := rdb.NewAdaptive(r.c.rdb, r.c.ks, p.Name()).Tick(tctx, rdb.AdaptiveParams{
		Window: a.Window, Min: a.Min, Max: p.MaxSize(), Configured: p.Size(), Tolerance: a.Tolerance,
	}, s)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("adaptive limit: tick failed", "pool", p.Name(), "error", err)
		}
		return
	}
	if !d.Changed {
		return
	}
	attrs := []any{"pool", p.Name(), "from", d.From, "to", d.Limit, "reason", d.Reason}
	if d.Operator {
		attrs = append(attrs, "note", "an operator's size is in effect until reset")
	}
	r.log.Info("adaptive limit changed", attrs...)
	if d.Limit > d.From && !d.Operator {
		// Open the queues and wake the waiting jobs now, not at the
		// keeper's next tick.
		if g := r.gates[p.Name()]; g != nil {
			if err := g.settle(tctx); err != nil && ctx.Err() == nil {
				r.log.Warn("adaptive limit: settle the gate", "pool", p.Name(), "error", err)
			}
		}
	}
}
