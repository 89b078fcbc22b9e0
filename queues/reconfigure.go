package queues

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// PoolChange says how Reconfigure changed one pool.
type PoolChange struct {
	Pool string
	// Changed names the settings that changed (config keys: "size",
	// "tiers", "tier order", ...).
	Changed []string
	// Rebuilt names the changes that made the pool's asynq server be
	// rebuilt: asynq fixes them when a server is created (see
	// Reconfigure); empty when the pool took its new settings while it
	// ran.
	Rebuilt []string
}

// Reconfigure puts cfg's priority tiers and pools in place of the client's
// while it runs, in this process: a new tier order, new sizes, door, rate
// and gate settings, a tier added to or removed from a pool. Queued jobs
// stay where they are, in their order; running jobs go on.
//
// cfg is validated fully (with the client's Handlers) before anything
// changes: every problem is returned at once as a *ConfigError and the
// client keeps running as it was. Beyond Validate, a reconfiguration may
// not change what the running client is built on: the namespace, the
// shutdown timeout and the delayed check interval; which pools exist, each
// pool's job types and scope, nor whether it has a circuit breaker (its
// settings may change). Nor may it take a tier from a pool while the tier's queue
// still holds jobs (pending, scheduled, retrying or running): they would
// never run. cfg's Handlers, Middleware, Logger, Observer,
// OnBreakerChange, Clock and RetryDelay are not used: the client keeps its
// own.
//
// Most settings take effect at once, at the next job (the cluster-wide
// gate reads them at each start and end). A change asynq fixes when it
// creates a server (the pool's queues and their order: tiers added,
// removed or reordered; queue_order; weights; poll_interval; dequeue_loops; the
// concurrency, which is size for a process-scoped pool and max_size for a
// cluster-scoped one) rebuilds that pool's server: the old server stops
// taking jobs and a new one starts with the new settings. For a
// cluster-scoped pool the new server starts at once and the old one stops
// when its running jobs have ended, however long they take (the gate holds
// the pool to its size across both). For a process-scoped pool, which only
// asynq's concurrency caps, the old server drains first: its running jobs
// get up to the shutdown timeout (jobs still running then are cancelled
// and go back to the head of their queue, no retry used), then the new
// server starts. Other pools keep running meanwhile. Reconfigure returns
// once every rebuilt pool takes jobs again, and says what it changed; ctx
// bounds only the checks it makes in Redis before changing anything.
//
// A client that does not run jobs (no Handlers) takes the new pools for
// its next enqueue. Reconfigure after Stop is an error. Calls are serialized.
func (c *Client) Reconfigure(ctx context.Context, cfg Config) ([]PoolChange, error) {
	c.reconfiguring.Lock() // one at a time: each compares with the pools in effect
	defer c.reconfiguring.Unlock()
	cfg = cfg.WithDefaults()
	cfg.Handlers, cfg.Middleware, cfg.Logger, cfg.Observer = c.cfg.Handlers, c.cfg.Middleware, c.cfg.Logger, c.cfg.Observer
	cfg.Clock, cfg.RetryDelay, cfg.OnBreakerChange = c.cfg.Clock, c.cfg.RetryDelay, c.cfg.OnBreakerChange
	problems := cfg.Problems()
	old := c.pools()
	problems = append(problems, c.fixedProblems(cfg, old)...)
	if len(problems) > 0 {
		return nil, &ConfigError{Problems: problems}
	}
	reg, err := newRegistry(cfg, c.ks, old)
	if err != nil {
		return nil, err
	}
	var changes []PoolChange
	for _, p := range reg.pools {
		if ch := poolChange(old.byName[p.Name()], p); len(ch.Changed) > 0 {
			changes = append(changes, ch)
		}
	}
	if err := c.checkRemovedTiers(ctx, old, reg); err != nil {
		return nil, err
	}
	// The configured sizes fit the budgets (Problems); the sizes operators
	// set in Redis must too.
	if err := c.checkBudgetFrom(ctx, old, reg, "", 0); err != nil {
		if errors.Is(err, ErrOverBudget) {
			return nil, &ConfigError{Problems: []string{"with the sizes in effect: " + strings.TrimPrefix(err.Error(), ErrOverBudget.Error()+": ")}}
		}
		return nil, err
	}
	reg.deps.commit() // every check passed: the new capacities hold
	for _, p := range reg.pools {
		if o := old.byName[p.Name()]; o != nil && o.cfg.Adaptive != nil && p.cfg.Adaptive == nil {
			// The size the adaptive limit wrote would read as an
			// operator's.
			if err := rdb.NewAdaptive(c.rdb, c.ks, p.Name()).Clear(ctx); err != nil {
				return nil, fmt.Errorf("pool %q: %w", p.Name(), err)
			}
		}
	}
	if c.run == nil {
		c.reg.Store(reg)
		return changes, nil
	}
	return changes, c.run.reconfigure(reg, changes)
}

// fixedProblems lists what cfg would change that a running client cannot.
func (c *Client) fixedProblems(cfg Config, old *registry) []string {
	var out []string
	restart := func(format string, args ...any) {
		out = append(out, fmt.Sprintf(format, args...)+": cannot change while the client runs (restart it)")
	}
	if cfg.Namespace != c.cfg.Namespace {
		restart("namespace: %q to %q", c.cfg.Namespace, cfg.Namespace)
	}
	if cfg.ShutdownTimeout != c.cfg.ShutdownTimeout {
		restart("shutdown_timeout: %s to %s", c.cfg.ShutdownTimeout, cfg.ShutdownTimeout)
	}
	if cfg.RecoverAfter != c.cfg.RecoverAfter {
		restart("recover_after: %s to %s", c.cfg.RecoverAfter, cfg.RecoverAfter)
	}
	if cfg.DelayedCheckInterval != c.cfg.DelayedCheckInterval {
		restart("delayed_check_interval: %s to %s", c.cfg.DelayedCheckInterval, cfg.DelayedCheckInterval)
	}
	seen := map[string]bool{}
	for _, pc := range cfg.Pools {
		seen[pc.Name] = true
		o, ok := old.byName[pc.Name]
		if !ok {
			restart("pool %q: a pool added", pc.Name)
			continue
		}
		if !slices.Equal(slices.Sorted(slices.Values(o.cfg.JobTypes)), slices.Sorted(slices.Values(pc.JobTypes))) {
			restart("pool %q: job_types %q to %q (jobs already queued would arrive in a pool that no longer runs them)", pc.Name, o.cfg.JobTypes, pc.JobTypes)
		}
		if o.cfg.Scope != pc.Scope {
			restart("pool %q: scope %q to %q", pc.Name, o.cfg.Scope, pc.Scope)
		}
		if (o.cfg.Breaker == nil) != (pc.Breaker == nil) {
			restart("pool %q: a breaker added or removed", pc.Name)
		}
	}
	for _, p := range old.pools {
		if !seen[p.Name()] {
			restart("pool %q: a pool removed", p.Name())
		}
	}
	return out
}

// checkRemovedTiers refuses a reconfiguration that takes from a pool a
// queue that still holds jobs.
func (c *Client) checkRemovedTiers(ctx context.Context, old, reg *registry) error {
	var problems []string
	for _, o := range old.pools {
		for _, q := range o.queues {
			if slices.Contains(reg.byName[o.Name()].queues, q) {
				continue
			}
			info, err := c.insp.GetQueueInfo(q)
			switch {
			case errors.Is(err, asynq.ErrQueueNotFound) || (err != nil && strings.Contains(err.Error(), "does not exist")):
				continue // nothing was ever enqueued there
			case err != nil:
				return fmt.Errorf("pool %q: look at queue %s: %w", o.Name(), q, err)
			}
			if n := info.Pending + info.Scheduled + info.Retry + info.Active; n > 0 {
				problems = append(problems, fmt.Sprintf("pool %q: tier %q is removed but its queue %s still holds %d jobs (pending %d, scheduled %d, retry %d, running %d); they would never run: move or finish them first",
					o.Name(), o.TierOf(q), q, n, info.Pending, info.Scheduled, info.Retry, info.Active))
			}
		}
	}
	if len(problems) > 0 {
		return &ConfigError{Problems: problems}
	}
	return nil
}

// poolChange compares a pool's old and new settings.
func poolChange(o, p *Pool) PoolChange {
	ch := PoolChange{Pool: p.Name()}
	rebuild := func(what string) { ch.Rebuilt = append(ch.Rebuilt, what) }
	sameSet := slices.Equal(slices.Sorted(slices.Values(o.tiers)), slices.Sorted(slices.Values(p.tiers)))
	switch {
	case !sameSet:
		rebuild("tiers")
	case !slices.Equal(o.queues, p.queues):
		rebuild("tier order")
	}
	if o.cfg.QueueOrder != p.cfg.QueueOrder {
		rebuild("queue_order")
	}
	if !maps.Equal(o.asynqQueues(), p.asynqQueues()) && sameSet && o.cfg.QueueOrder == p.cfg.QueueOrder && slices.Equal(o.queues, p.queues) {
		rebuild("weights")
	}
	if o.cfg.PollInterval != p.cfg.PollInterval {
		rebuild("poll_interval")
	}
	if o.cfg.DequeueLoops != p.cfg.DequeueLoops {
		rebuild("dequeue_loops")
	}
	if !maps.Equal(o.cfg.Reserved, p.cfg.Reserved) {
		// The reserved lane's queues and concurrency come from the
		// reservations (see runner.newLane).
		rebuild("reserved")
	}
	if o.cfg.concurrency() != p.cfg.concurrency() {
		if p.Scope() == ScopeCluster {
			rebuild("max_size")
		} else {
			rebuild("size")
		}
	} else if o.cfg.lookAhead() != p.cfg.lookAhead() && !slices.Contains(ch.Rebuilt, "reserved") {
		// A maximum wait or a start rate added or removed: the jobs a
		// process may hold waiting for a slot change with it (lookAhead).
		if reflect.DeepEqual(o.cfg.MaxWait, p.cfg.MaxWait) {
			rebuild("start_rate")
		} else {
			rebuild("max_wait")
		}
	}
	ch.Changed = append(ch.Changed, ch.Rebuilt...)
	// Every other field: compared by reflection, so that a setting added
	// to PoolConfig is reported without a change here.
	ov, pv := reflect.ValueOf(o.cfg), reflect.ValueOf(p.cfg)
	for i := range ov.NumField() {
		f := ov.Type().Field(i)
		key := strings.Split(f.Tag.Get("json"), ",")[0]
		switch key {
		case "tiers", "queue_order", "weights", "poll_interval", "dequeue_loops", "reserved":
			continue // above
		case "max_size", "max_wait", "start_rate":
			if p.Scope() == ScopeCluster && slices.Contains(ch.Rebuilt, key) {
				continue
			}
		case "size":
			if p.Scope() == ScopeProcess && slices.Contains(ch.Rebuilt, "size") {
				continue
			}
		}
		if !reflect.DeepEqual(ov.Field(i).Interface(), pv.Field(i).Interface()) {
			ch.Changed = append(ch.Changed, key)
		}
	}
	sort.Strings(ch.Changed[len(ch.Rebuilt):])
	return ch
}

// reconfigure puts reg in place while the pools run: the gates take the
// new settings at once, and the pools whose server must be rebuilt get a
// new one (see Client.Reconfigure), one after the other, while the others
// run.
func (r *runner) reconfigure(reg *registry, changes []PoolChange) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return ErrStopped
	}
	rebuild := map[string]bool{}
	for _, ch := range changes {
		if len(ch.Rebuilt) > 0 {
			rebuild[ch.Pool] = true
		}
	}
	// A pool to rebuild stops taking jobs first, so that its old server
	// never dequeues by the new settings' queues.
	for name := range rebuild {
		if r.started {
			r.servers[name].Stop()
			if lane := r.lanes[name]; lane != nil {
				lane.Stop()
			}
		}
	}
	r.c.reg.Store(reg)
	for _, p := range reg.pools {
		if g := r.gates[p.Name()]; g != nil {
			g.configure(p)
			// The pause flags follow the new tiers, order and
			// reservations now, not at the next job or keeper tick.
			if err := g.settle(context.Background()); err != nil {
				r.log.Warn("pool reconfigured; its gate settles at its next call (Redis failed)", "pool", p.Name(), "error", err)
			}
		}
		if b := r.breaker[p.Name()]; b != nil {
			b.configure(p)
		}
	}
	for _, ch := range changes {
		r.log.Info("pool reconfigured", "pool", ch.Pool, "changed", ch.Changed, "rebuilt_for", ch.Rebuilt)
	}
	for _, p := range reg.pools {
		if !rebuild[p.Name()] {
			continue
		}
		name := p.Name()
		old, oldInflight := r.servers[name], r.inflight[name]
		srv := r.newServer(p)
		r.servers[name] = srv
		r.rebuildLane(p)
		if !r.started {
			continue
		}
		if p.Scope() == ScopeProcess {
			// Only asynq's concurrency caps a process-scoped pool: the old
			// server's jobs end before the new server takes any.
			r.log.Info("pool draining for its rebuild", "pool", name, "running", oldInflight.Load(), "shutdown_timeout", r.c.cfg.ShutdownTimeout.String())
			old.Shutdown()
		} else {
			// The gate holds a cluster-scoped pool to its size whatever
			// the servers: the new one takes jobs now, and the old one
			// lets its running jobs finish, however long they take.
			r.drains.Go(func() { r.retire(name, old, oldInflight) })
		}
		r.inflight[name] = new(atomic.Int64)
		if err := srv.Start(r.handler(p, r.inflight[name])); err != nil {
			// The pool no longer runs here; the others do. Say so loudly:
			// a restart brings it back.
			r.log.Error("pool could not start again after its rebuild; it runs no jobs in this process until a restart", "pool", name, "error", err)
			return fmt.Errorf("pool %q: start after its rebuild: %w", name, err)
		}
		r.logStarted(p, "pool started again")
	}
	return nil
}

// rebuildLane replaces a rebuilt pool's reserved lane (see newLane) by
// one built from its new settings, or by none; the old lane (lanes exist
// only for cluster-scoped pools, which the gate holds to their size)
// finishes its running jobs before it stops, like the old server.
func (r *runner) rebuildLane(p *Pool) {
	name := p.Name()
	if old := r.lanes[name]; old != nil {
		oldInflight := r.laneInflight[name]
		delete(r.lanes, name)
		if r.started {
			r.drains.Go(func() { r.retire(name, old, oldInflight) })
		}
	}
	lane := r.newLane(p)
	if lane == nil {
		return
	}
	r.lanes[name] = lane
	if !r.started {
		return
	}
	r.laneInflight[name] = new(atomic.Int64)
	if err := lane.Start(r.handler(p, r.laneInflight[name])); err != nil {
		// The pool's own server serves the reserved tiers too (the gate
		// still keeps their slots); only the lane's spare workers are
		// missing. The rebuild goes on.
		delete(r.lanes, name)
		r.log.Error("pool's reserved lane could not start again after its rebuild; the pool's own server serves its reserved tiers until a restart", "pool", name, "error", err)
	}
}

// retireEvery is how often a retired server looks whether its last job
// has ended.
const retireEvery = 100 * time.Millisecond

// retire stops a cluster-scoped pool's old server once the jobs it runs
// have ended (it takes no new ones: it was stopped), or at once, with the
// shutdown timeout, when the client stops.
func (r *runner) retire(name string, srv interface{ Shutdown() }, inflight *atomic.Int64) {
	if n := inflight.Load(); n > 0 {
		r.log.Info("pool's old server finishes its running jobs before it stops", "pool", name, "running", n)
	}
	t := time.NewTicker(retireEvery)
	defer t.Stop()
	for inflight.Load() > 0 {
		select {
		case <-t.C:
		case <-r.drainCtx.Done():
			srv.Shutdown()
			return
		}
	}
	srv.Shutdown()
	r.log.Info("pool's old server stopped", "pool", name)
}
