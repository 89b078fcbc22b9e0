package queues

import (
	"context"
	"time"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// Recovery after a failed call to Redis: the slots of the jobs this
// process still runs are added back before anything new is admitted
// (recover, renewHeld), with a grace when they may have lapsed or the
// Redis server changed (serverChanged).

// failed notes that a call to Redis failed: the held slots may have lapsed
// by the time Redis answers again. The gate's own stop is no failure.
func (g *gate) failed(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	g.mu.Lock()
	g.recovering = true
	g.failures++
	g.handOff.ok, g.handOff.room = false, false // no hand-off until a reply to a later call allows it again
	g.mu.Unlock()
}

// unsure says whether a call of the gate to Redis failed and none has
// worked since: Redis may be down.
func (g *gate) unsure() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.recovering
}

// ok notes a call to Redis that succeeded.
func (g *gate) ok() {
	g.mu.Lock()
	g.lastOK = time.Now()
	g.mu.Unlock()
}

// recover, after a failed call, re-adds the slots of the jobs this process
// still runs. When Redis was out of reach long enough for a slot to lapse,
// it also starts a recovery grace in which nothing new is admitted, so that
// every other process still running jobs re-adds theirs first.
func (g *gate) recover(ctx context.Context) error {
	g.mu.Lock()
	recovering := g.recovering
	g.recovering = false
	g.mu.Unlock()
	if !recovering {
		return nil
	}
	bg := context.WithoutCancel(ctx)
	if err := g.renewHeld(bg, true, g.serverChanged(bg)); err != nil {
		g.failed(ctx)
		return err
	}
	g.ok()
	return nil
}

// renew extends the leases this process holds.
func (g *gate) renew(ctx context.Context) {
	if err := g.renewHeld(ctx, false, false); err != nil {
		g.failed(ctx)
		return
	}
	g.ok()
}

// renewHeld extends the held leases; in recovery it re-adds lapsed ones
// and, after a long enough outage or when the Redis server changed
// (swapped), starts the grace.
func (g *gate) renewHeld(ctx context.Context, recovering, swapped bool) error {
	g.renewMu.Lock()
	defer g.renewMu.Unlock()
	g.mu.Lock()
	grace := time.Duration(0)
	if recovering && (swapped || time.Since(g.lastOK) > GateLeaseTTL-gateRenewEvery) {
		// A slot lapses only when it was not renewed for GateLeaseTTL; the
		// last renewal was at most gateRenewEvery before the last success.
		// A failover can lose a lease at once.
		grace = gateRecoveryGrace
	}
	if recovering {
		// The jobs slots were handed to whose ops Redis has not heard of
		// are re-added too (they are held): from here on their releases
		// must go after those ops, never be taken back out of them (unhand),
		// or the lease re-added here would stay behind them.
		for _, op := range g.handing {
			op.toNew = false
		}
	}
	a := rdb.RenewArgs{Members: make([]string, 0, len(g.held)), Readd: recovering, Grace: grace}
	for m := range g.held {
		a.Members = append(a.Members, m)
	}
	g.mu.Unlock()
	if len(a.Members) == 0 && grace == 0 {
		return nil
	}
	_, err := g.conf.Load().slots.Renew(ctx, a)
	return err
}

// serverChanged says whether the Redis node that holds the pool's keys is
// another server (or the same one restarted) since the gate last looked:
// its run_id changed. A Sentinel failover promotes a replica that may have
// missed the last writes (asynchronous replication), leases among them,
// however short the outage; the recovery grace must then run even though no
// lease could have lapsed by the clock. An unreadable run_id (a Redis that
// does not report one, as the embedded one) leaves the decision to the
// clock alone, as before this check; so does a failure to read it (Redis
// still down: the renewal after it fails too, and recovery runs again).
func (g *gate) serverChanged(ctx context.Context) bool {
	id, err := g.identify(ctx)
	if err != nil || id == "" {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	changed := g.serverID != "" && id != g.serverID
	g.serverID = id
	return changed
}

// learnServer notes which Redis server holds the pool's keys, so that a
// later recovery can tell a failover (serverChanged). A failure leaves it
// unknown until the next recovery.
func (g *gate) learnServer(ctx context.Context) {
	if id, err := g.identify(ctx); err == nil && id != "" {
		g.mu.Lock()
		if g.serverID == "" {
			g.serverID = id
		}
		g.mu.Unlock()
	}
}
