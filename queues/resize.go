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
	if err := rdb.NewPools(c.rdb, c.ks).SetSize(ctx, pool, size); err != nil {
		return fmt.Errorf("resize pool %q: %w", pool, err)
	}
	return c.settleGate(ctx, p)
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
	if err := rdb.NewPools(c.rdb, c.ks).ResetSize(ctx, pool); err != nil {
		return fmt.Errorf("reset the size of pool %q: %w", pool, err)
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
