package queues

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// ErrInvalidResize is matched by a resize refused for what was asked: an
// unknown pool, a pool scoped per process, or a size out of its bounds.
// Nothing was changed.
var ErrInvalidResize = errors.New("invalid resize")

// Resize sets a cluster-scoped pool's size to size in every worker process
// on the Redis, until ResetSize: the size lives in Redis, and the gate's
// scripts read it at every start and end of a job (and its keeper every
// 2 s), atomically with the count of slots held.
//
// Growing: Resize opens the pool's queues and wakes the jobs waiting for a
// slot before it returns; a process whose dequeue loop is asleep (its
// queues looked empty or paused) takes new jobs when it wakes, within 1.5
// times the pool's poll_interval. Shrinking: no job starts from the moment
// Resize returns until the pool is under its new size; running jobs are
// not touched and finish as usual.
//
// size must be at least 1 and at most the pool's MaxSize in this client's
// config (each process runs at most its own MaxSize of the pool's jobs at
// once), and more than the pool's reserved slots, if any. A pool scoped per process, an unknown pool or a size out of bounds
// is an error matching ErrInvalidResize, and nothing is changed.
func (c *Client) Resize(ctx context.Context, pool string, size int) error {
	p, err := c.resizable(pool)
	if err != nil {
		return err
	}
	if size < 1 || size > p.MaxSize() {
		return fmt.Errorf("%w: pool %q: size must be from 1 to its max_size %d, got %d (raise max_size in the config to allow more; each worker process needs it)",
			ErrInvalidResize, pool, p.MaxSize(), size)
	}
	reserved := 0
	for _, n := range p.cfg.Reserved {
		reserved += n
	}
	if reserved > 0 && size <= reserved {
		return fmt.Errorf("%w: pool %q: size must be more than its %d reserved slots (the lower tiers would get none), got %d",
			ErrInvalidResize, pool, reserved, size)
	}
	reg := c.pools()
	if err := c.checkBudget(ctx, reg, pool, size); err != nil {
		return fmt.Errorf("resize pool %q to %d: %w", pool, size, err)
	}
	prev, hadPrev, err := rdb.NewPools(c.rdb, c.ks).Size(ctx, pool)
	if err != nil {
		return fmt.Errorf("resize pool %q: %w", pool, err)
	}
	if err := c.writeSize(ctx, p, size); err != nil {
		return fmt.Errorf("resize pool %q: %w", pool, err)
	}
	if err := c.recheckBudget(ctx, reg, p, size, prev, hadPrev); err != nil {
		return fmt.Errorf("resize pool %q to %d: %w", pool, size, err)
	}
	return c.settleGate(ctx, p)
}

// recheckBudget checks the budgets again once p's size was written as
// size: two resizes of different pools at once could each fit alone. On a
// conflict it puts p's size back (prev, or none) and returns the refusal.
// An adaptive pool claims its max_size whatever its size: nothing to
// check again.
func (c *Client) recheckBudget(ctx context.Context, reg *registry, p *Pool, size, prev int, hadPrev bool) error {
	if p.cfg.Adaptive != nil {
		return nil
	}
	err := c.checkBudget(ctx, reg, p.Name(), size)
	if err == nil {
		return nil
	}
	pools := rdb.NewPools(c.rdb, c.ks)
	uerr := pools.ResetSize(ctx, p.Name())
	if hadPrev {
		uerr = pools.SetSize(ctx, p.Name(), prev)
	}
	if uerr != nil {
		return fmt.Errorf("%w (and putting its size back failed: %w)", err, uerr)
	}
	return fmt.Errorf("%w (another resize changed the pools meanwhile; nothing was changed)", err)
}

// writeSize writes an operator's size of p: for an adaptive pool with the
// mark that holds its adaptive limit off until ResetSize.
func (c *Client) writeSize(ctx context.Context, p *Pool, size int) error {
	if p.cfg.Adaptive != nil {
		return rdb.NewAdaptive(c.rdb, c.ks, p.Name()).Override(ctx, size)
	}
	return rdb.NewPools(c.rdb, c.ks).SetSize(ctx, p.Name(), size)
}

// ResetSize gives a cluster-scoped pool its configured size back, in every
// worker process (each process's own config says what that is). The same
// bounds in time as Resize hold. Resetting a pool that was not resized
// changes nothing.
func (c *Client) ResetSize(ctx context.Context, pool string) error {
	p, err := c.resizable(pool)
	if err != nil {
		return err
	}
	reg := c.pools()
	prev, hadPrev, err := rdb.NewPools(c.rdb, c.ks).Size(ctx, pool)
	if err != nil {
		return fmt.Errorf("reset the size of pool %q: %w", pool, err)
	}
	if p.cfg.Adaptive == nil {
		if err := c.checkBudget(ctx, reg, pool, p.Size()); err != nil {
			return fmt.Errorf("reset the size of pool %q to its configured %d: %w", pool, p.Size(), err)
		}
	}
	reset := rdb.NewPools(c.rdb, c.ks).ResetSize
	if p.cfg.Adaptive != nil {
		// The adaptive limit holds again, from where it was.
		reset = func(ctx context.Context, _ string) error { return rdb.NewAdaptive(c.rdb, c.ks, pool).Override(ctx, 0) }
	}
	if err := reset(ctx, pool); err != nil {
		return fmt.Errorf("reset the size of pool %q: %w", pool, err)
	}
	if err := c.recheckBudget(ctx, reg, p, p.Size(), prev, hadPrev); err != nil {
		return fmt.Errorf("reset the size of pool %q to its configured %d: %w", pool, p.Size(), err)
	}
	return c.settleGate(ctx, p)
}

// PoolSize is a pool's size: as configured, and in effect.
type PoolSize struct {
	// Configured is the size in this client's config.
	Configured int `json:"configured"`
	// Effective is the size in effect: an operator's (Resized), or the
	// configured one.
	Effective int `json:"effective"`
	// Resized says an operator's size is in effect (Client.Resize).
	Resized bool `json:"resized"`
	// Max is the most the pool may be resized to (max_size).
	Max int `json:"max"`
	// Adaptive is the pool's adaptive limit (PoolConfig.Adaptive), nil for
	// a pool without one. Without an operator's size, Effective is its
	// limit (the configured size until its first tick).
	Adaptive *AdaptiveStatus `json:"adaptive,omitempty"`
}

// AdaptiveStatus is an adaptive pool's limit: where it stands, why it
// last moved, and its latest changes.
type AdaptiveStatus struct {
	// Min and Max bound the limit (adaptive.min and max_size).
	Min int `json:"min"`
	Max int `json:"max"`
	// Limit is the limit now: the size in effect unless an operator's size
	// overrides it (PoolSize.Resized); before its first tick, the
	// configured size it starts from.
	Limit int `json:"limit"`
	// Reason says why it last changed, At when (zero: never).
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at,omitzero"`
	// Baseline is the job latency it compares the recent jobs with.
	Baseline time.Duration `json:"baseline_ns"`
	// Changes counts its changes so far, by every process.
	Changes int64 `json:"changes"`
	// Log is its latest changes, newest first, and an operator's
	// overrides and resets (From or To 0 there).
	Log []AdaptiveChange `json:"log,omitempty"`
}

// AdaptiveChange is one change of an adaptive limit.
type AdaptiveChange struct {
	At     time.Time `json:"at"`
	From   int       `json:"from"`
	To     int       `json:"to"`
	Reason string    `json:"reason"`
}

// adaptiveStatus reads p's adaptive limit from a.
func adaptiveStatus(p *Pool, a rdb.AdaptiveState) *AdaptiveStatus {
	s := &AdaptiveStatus{Min: p.cfg.Adaptive.Min, Max: p.MaxSize(), Limit: a.Limit, Reason: a.Reason, At: a.At, Baseline: a.Baseline, Changes: a.ChangeCount}
	if s.Limit == 0 {
		s.Limit = min(s.Max, max(s.Min, p.Size())) // where its first tick starts
	}
	for _, ch := range a.Changes {
		s.Log = append(s.Log, AdaptiveChange{At: ch.At, From: ch.From, To: ch.To, Reason: ch.Reason})
	}
	return s
}

// PoolSize reads a pool's size in effect. For a pool scoped per process it
// is the configured size.
func (c *Client) PoolSize(ctx context.Context, pool string) (PoolSize, error) {
	p, err := c.pools().get(pool)
	if err != nil {
		return PoolSize{}, err
	}
	s := PoolSize{Configured: p.Size(), Effective: p.Size(), Max: p.MaxSize()}
	if p.Scope() != ScopeCluster {
		return s, nil
	}
	n, set, err := rdb.NewPools(c.rdb, c.ks).Size(ctx, pool)
	if err != nil {
		return PoolSize{}, fmt.Errorf("pool %q: size: %w", pool, err)
	}
	if set {
		s.Effective, s.Resized = n, true
	}
	if p.cfg.Adaptive != nil {
		b := rdb.NewPools(c.rdb, c.ks).Batch()
		read := b.Adaptive(pool, rdb.AdaptiveLogKeep)
		if err := b.Exec(ctx); err != nil {
			return PoolSize{}, fmt.Errorf("pool %q: adaptive limit: %w", pool, err)
		}
		a, err := read.Result()
		if err != nil {
			return PoolSize{}, fmt.Errorf("pool %q: adaptive limit: %w", pool, err)
		}
		s.Adaptive = adaptiveStatus(p, a)
		s.Resized = set && a.Operator
	}
	return s, nil
}

// resizable returns the pool called name if it is cluster-scoped.
func (c *Client) resizable(name string) (*Pool, error) {
	p, err := c.pools().get(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidResize, err)
	}
	if p.Scope() != ScopeCluster {
		return nil, fmt.Errorf("%w: pool %q is scoped per process: its size is each worker's asynq concurrency, fixed when its server starts; change size in the config and reload the workers (SIGHUP)", ErrInvalidResize, name)
	}
	return p, nil
}

// settleGate settles the pool's pause flags for its size in effect and,
// when it has room, wakes the jobs waiting for a slot in every process:
// what the gate's keeper would do at its next tick, at once.
func (c *Client) settleGate(ctx context.Context, p *Pool) error {
	g := newGate(c.rdb, c.ks, p, newProcessID(), time.Now)
	if err := g.settle(ctx); err != nil {
		return fmt.Errorf("pool %q: settle the gate: %w", p.Name(), err)
	}
	return nil
}
