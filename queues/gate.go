package queues

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Gate timings.
const (
	// GateLeaseTTL is how long a slot stays held without renewal: a killed
	// process's slots are free again at most this long after its last
	// renewal (plus one keeper tick).
	GateLeaseTTL = 15 * time.Second
	// gateRenewEvery renews the leases a process holds.
	gateRenewEvery = GateLeaseTTL / 3
	// gateKeeperEvery runs the cleanup that frees expired leases and
	// settles the pause flags even when no job starts or ends.
	gateKeeperEvery = 2 * time.Second
	// gateRecoveryGrace is how long nothing new is admitted after a process
	// finds Redis back from an outage, so that every process still running
	// jobs re-adds their slots first: each does so at its next call to the
	// gate, a keeper tick at the latest.
	gateRecoveryGrace = 2*gateKeeperEvery + time.Second
	// gateRetryEvery is how often a job that was taken from its queue
	// before a slot was free asks again if no "slot freed" message came
	// (they normally wake it at once).
	gateRetryEvery = 100 * time.Millisecond
	// gatePauseValue marks a queue pause set by the gate, so the gate never
	// lifts a pause an operator set by hand.
	gatePauseValue = "compartment-gate"
)

// errGateWait marks a job that gave up waiting for a cluster-wide slot
// (its context ended). It is not a failure of the job.
var errGateWait = errors.New("gave up waiting for a cluster-wide slot")

// The cluster-wide gate of a pool.
//
// Slots are leases in a sorted set (member: job and queue, score: expiry),
// renewed while the job runs. Every time the gate reads or writes is
// Redis's own clock (TIME inside the scripts), so no worker's clock
// matters. Each call settles the pool's pause flags (asynq's dequeue script
// skips a paused queue): all paused while the pool is full; with strict
// tiers, open only down to the highest tier that has pending jobs, so that
// no process can take a lower tier's job while a higher one waits. The gate
// only ever lifts a pause it set itself (the key holds gatePauseValue); an
// operator's pause stays.
//
// Race window: a process that dequeued a job just before the pause was set
// finds no free slot. It does not put the job back (no churn, no
// reordering); it registers as a waiter and asks again when a "slot freed"
// message arrives, or every gateRetryEvery. A waiter, and any job asking for
// a slot, goes only if no better-placed waiter is ahead of it (higher tier
// first, then longer waiting) and no higher-tier job was dequeued without
// asking yet. Waiters and leases both expire unless refreshed, so a killed
// process holds nothing for longer than GateLeaseTTL. After a Redis outage
// a process re-adds the slots of the jobs it still runs before anything new
// is admitted (gateRecoveryGrace). docs/CLUSTER.md states what remains.
type gate struct {
	rdb         redis.UniversalClient
	pool        *Pool
	size        int
	strict      string // "1" for strict tiers
	leases      string
	waiting     string
	keys        []string // see lua/gate_lib.lua
	queueArgs   []any    // the queue names, for the scripts
	processID   string
	wakeChannel string
	now         func() time.Time // local durations only (stats)

	mu         sync.Mutex
	held       map[string]bool
	wake       chan struct{} // closed when a slot may have freed somewhere
	recovering bool          // a call to Redis failed: re-add held slots first
	waits      int64         // jobs that waited for a slot after being dequeued
	waitsTotal time.Duration
}

// newProcessID names this process in lease holders: host, pid and a random
// suffix (several clients in one process each get their own).
func newProcessID() string {
	host, _ := os.Hostname()
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

func newGate(rdb redis.UniversalClient, namespace string, p *Pool, processID string, now func() time.Time) *gate {
	leases, waiting := GateKeys(namespace, p.Name())
	g := &gate{
		rdb: rdb, pool: p, size: p.Size(), leases: leases, waiting: waiting,
		processID: processID, held: map[string]bool{}, wake: make(chan struct{}), wakeChannel: leases + ":freed", now: now,
		strict: "0",
	}
	if p.cfg.QueueOrder == QueueOrderStrict {
		g.strict = "1"
	}
	g.keys = []string{leases, waiting, waiting + ":expiry", leases + ":holders", leases + ":grace"}
	qs := p.Queues()
	for _, f := range []func(string) string{asynqPausedKey, asynqPendingKey, asynqActiveKey, asynqLeaseKey} {
		for _, q := range qs {
			g.keys = append(g.keys, f(q))
		}
	}
	for _, q := range qs {
		g.queueArgs = append(g.queueArgs, q)
	}
	return g
}

//go:embed lua/gate_lib.lua
var gateLib string

//go:embed lua/gate_acquire.lua
var acquireLua string

//go:embed lua/gate_release.lua
var releaseLua string

//go:embed lua/gate_renew.lua
var renewLua string

// The gate's scripts, each with the shared functions of gate_lib.lua in
// front; their KEYS and ARGV are described at the top of each file.
var (
	acquireScript = redis.NewScript(gateLib + acquireLua)
	releaseScript = redis.NewScript(gateLib + releaseLua)
	renewScript   = redis.NewScript(gateLib + renewLua)
)

// acquire takes a cluster-wide slot for the job, waiting (as a waiter, see
// gate) until it may. It returns the lease member to release.
func (g *gate) acquire(ctx context.Context, jobID, queue string) (string, error) {
	member := jobID + "@" + queue
	rank := g.pool.rank(queue)
	var waitedSince time.Time
	for {
		wake := g.wakeCh() // taken before asking, so a wake-up in between is not missed
		if err := g.recover(ctx); err != nil {
			return "", fmt.Errorf("pool %q: cluster-wide slot: %w", g.pool.Name(), err)
		}
		args := []any{g.size, member, rank, len(g.queueArgs), g.processID, GateLeaseTTL.Milliseconds(), g.strict}
		args = append(args, g.queueArgs...)
		res, err := acquireScript.Run(context.WithoutCancel(ctx), g.rdb, g.keys, args...).Int64Slice()
		if err != nil {
			g.failed()
			return "", fmt.Errorf("pool %q: cluster-wide slot: %w", g.pool.Name(), err)
		}
		if res[0] == 1 {
			g.mu.Lock()
			g.held[member] = true
			if !waitedSince.IsZero() {
				g.waits++
				g.waitsTotal += g.now().Sub(waitedSince)
			}
			g.mu.Unlock()
			return member, nil
		}
		if waitedSince.IsZero() {
			waitedSince = g.now()
		}
		t := time.NewTimer(gateRetryEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			bg := context.WithoutCancel(ctx)
			g.rdb.ZRem(bg, g.waiting, member)
			g.rdb.ZRem(bg, g.keys[2], member)
			return "", fmt.Errorf("pool %q: %w: %w", g.pool.Name(), errGateWait, ctx.Err())
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

func (g *gate) wakeCh() chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.wake
}

// broadcast wakes every local waiter.
func (g *gate) broadcast() {
	g.mu.Lock()
	close(g.wake)
	g.wake = make(chan struct{})
	g.mu.Unlock()
}

// release frees a slot.
func (g *gate) release(ctx context.Context, member string) {
	g.mu.Lock()
	delete(g.held, member)
	g.mu.Unlock()
	g.tick(context.WithoutCancel(ctx), member)
}

// tick frees member's slot, or with member "" drops what dead processes
// left behind; either way it settles the pause flags.
func (g *gate) tick(ctx context.Context, member string) {
	if g.recover(ctx) != nil {
		return
	}
	err := releaseScript.Run(ctx, g.rdb, g.keys, g.size, member, len(g.queueArgs), g.wakeChannel, g.strict).Err()
	if err != nil {
		g.failed()
	}
}

// failed notes that a call to Redis failed: the held slots may have lapsed
// by the time Redis answers again.
func (g *gate) failed() {
	g.mu.Lock()
	g.recovering = true
	g.mu.Unlock()
}

// renew extends the leases this process holds, re-adding lapsed ones.
func (g *gate) renew(ctx context.Context) {
	if err := g.renewHeld(ctx, 0); err != nil {
		g.failed()
	}
}

// recover, after a failed call, re-adds the slots of the jobs this process
// still runs and starts a recovery grace in which nothing new is admitted.
func (g *gate) recover(ctx context.Context) error {
	g.mu.Lock()
	recovering := g.recovering
	g.mu.Unlock()
	if !recovering {
		return nil
	}
	if err := g.renewHeld(context.WithoutCancel(ctx), gateRecoveryGrace); err != nil {
		return err
	}
	g.mu.Lock()
	g.recovering = false
	g.mu.Unlock()
	return nil
}

func (g *gate) renewHeld(ctx context.Context, grace time.Duration) error {
	g.mu.Lock()
	args := make([]any, 0, 3+len(g.held))
	args = append(args, GateLeaseTTL.Milliseconds(), g.processID, grace.Milliseconds())
	for m := range g.held {
		args = append(args, m)
	}
	g.mu.Unlock()
	if len(args) == 3 && grace == 0 {
		return nil
	}
	return renewScript.Run(ctx, g.rdb, g.keys, args...).Err()
}

// run renews leases, keeps the gate clean and relays "a slot freed"
// messages to the local waiters until ctx ends.
func (g *gate) run(ctx context.Context) {
	sub := g.rdb.Subscribe(ctx, g.wakeChannel)
	defer sub.Close()
	go func() {
		for range sub.Channel() {
			g.broadcast()
		}
	}()
	renew := time.NewTicker(gateRenewEvery)
	keep := time.NewTicker(gateKeeperEvery)
	defer renew.Stop()
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-renew.C:
			g.renew(ctx)
		case <-keep.C:
			g.tick(ctx, "")
		}
	}
}

// GateStats says how a pool's cluster-wide gate behaved in this process.
type GateStats struct {
	// Waits counts jobs that were dequeued before a slot was free and
	// waited for one (they were never put back in their queue).
	Waits int64
	// WaitTime is the total time they waited.
	WaitTime time.Duration
}

func (g *gate) stats() GateStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return GateStats{Waits: g.waits, WaitTime: g.waitsTotal}
}

// ClusterSlots reads a pool's cluster-wide slots from Redis: the leases
// that have not expired by Redis's clock, by holder process (host:pid:id).
func ClusterSlots(ctx context.Context, rdb redis.UniversalClient, namespace, pool string) (active int, holders map[string]int, err error) {
	leases, _ := GateKeys(namespace, pool)
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return 0, nil, err
	}
	members, err := rdb.ZRangeByScore(ctx, leases, &redis.ZRangeBy{Min: strconv.FormatInt(now.UnixMilli(), 10), Max: "+inf"}).Result()
	if err != nil {
		return 0, nil, err
	}
	holders = map[string]int{}
	if len(members) == 0 {
		return 0, holders, nil
	}
	procs, err := rdb.HMGet(ctx, leases+":holders", members...).Result()
	if err != nil {
		return 0, nil, err
	}
	for _, p := range procs {
		name, _ := p.(string)
		if name == "" {
			name = "(unknown)"
		}
		holders[name]++
	}
	return len(members), holders, nil
}
