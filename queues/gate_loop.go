package queues

import (
	"context"
	_ "embed"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// The keeper: the loop that renews this process's leases, frees what
// dead processes left, settles the pause flags and relays the freed
// channel (run), and the process's word on what it can run (announce).

// run renews leases, keeps the gate clean and relays "a slot freed"
// messages to the local waiters until ctx ends.
func (g *gate) run(ctx context.Context) {
	sub := g.conf.Load().slots.SubscribeFreed(ctx)
	relayed := make(chan struct{})
	go func() {
		defer close(relayed)
		sub.Each(g.relay)
	}()
	defer func() {
		_ = sub.Close() // ends the relay's channel
		<-relayed
	}()
	g.learnServer(ctx)
	g.announce(ctx, true)
	defer func() {
		// A process that stops no longer counts among those that can run
		// the pool; bounded, so a Redis that is down cannot hold the stop.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		g.announce(wctx, false)
	}()
	renew := time.NewTicker(gateRenewEvery)
	keep := time.NewTicker(gateKeeperEvery)
	defer renew.Stop()
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			g.sendOps()
			return
		case <-renew.C:
			g.renew(ctx)
			g.announce(ctx, true)
		case <-keep.C:
			g.tick(ctx)
		}
	}
}

// settle sets the pause flags for the slots in use now, before the pool's
// server starts: the keeper's tick, at once.
func (g *gate) settle(ctx context.Context) error {
	_, err := g.release1(ctx, "")
	return err
}

// release1 runs the release script once: it frees member's slot (none for
// "") or its place among the waiters, hands the free slots to the best
// waiters in any process, and settles the pause flags. It tells this
// process's waiters that got a slot at once, and returns the count.
func (g *gate) release1(ctx context.Context, member string) (int, error) {
	res, err := g.conf.Load().slots.Release(ctx, member)
	if err != nil {
		return 0, err
	}
	for _, m := range res.Granted {
		g.grant(m)
	}
	return res.Count, nil
}

// clearGatePauses lifts the pauses a gate left on the queues of a pool that
// runs without one (its scope changed to process): nothing else would.
func clearGatePauses(ctx context.Context, rc redis.UniversalClient, p *Pool) error {
	return rdb.ClearGatePauses(ctx, rc, p.queues)
}

// announce tells Redis how many of the pool's jobs this process can run at
// once (its concurrency) for the next GateLeaseTTL, or with running false
// that it runs the pool no more, so that status can say what the live
// workers can run between them (PoolSlots.Capacity). When the pool's size
// in effect is more than that, it logs it once per state: an operator's
// resize above what the workers can reach is said where the workers' logs
// are read. A failed call is left to the next one.
func (g *gate) announce(ctx context.Context, running bool) {
	conf := g.conf.Load()
	v, err := conf.slots.Announce(ctx, running)
	if err != nil || !running || g.log == nil {
		return
	}
	size := v.OperatorSize
	if size < 1 {
		size = conf.size
	}
	state := [2]int{}
	if size > v.Capacity {
		state = [2]int{size, v.Capacity}
	}
	g.mu.Lock()
	changed := state != g.shortfall
	g.shortfall = state
	g.mu.Unlock()
	switch {
	case !changed:
	case state != [2]int{}:
		g.log.Warn("pool: the size in effect is more than the live workers can run; it is reached only when more workers start (or resize it down)",
			"pool", g.name, "size", size, "workers", v.Processes, "workers_can_run", v.Capacity)
	default:
		g.log.Info("pool: the live workers can run the size in effect again", "pool", g.name, "size", size, "workers", v.Processes, "workers_can_run", v.Capacity)
	}
}
