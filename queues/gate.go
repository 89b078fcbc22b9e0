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
	// gateKeeperEvery runs the cleanup that frees expired leases and lifts
	// the gate's pause even when no job starts or ends.
	gateKeeperEvery = 2 * time.Second
	// gateRetryEvery is how often a job that was taken from its queue
	// before a slot was free asks again if no "slot freed" message came
	// (they normally wake it at once).
	gateRetryEvery = 100 * time.Millisecond
	// gatePauseValue marks a queue pause set by the gate, so the gate never
	// lifts a pause an operator set by hand.
	gatePauseValue = "compartment-gate"
)

// gatePatience is how long a dequeued job gives way to pending jobs of a
// higher tier: long enough for an idle process to wake (asynq sleeps up to
// 1.5 poll intervals) and dequeue them, short enough that a process whose
// worker slots all hold lower-tier jobs does not stall for long.
func gatePatience(poll time.Duration) time.Duration {
	return max(time.Second, 2*poll+500*time.Millisecond)
}

// errGateWait marks a job that gave up waiting for a cluster-wide slot
// (its context ended). It is not a failure of the job.
var errGateWait = errors.New("gave up waiting for a cluster-wide slot")

// The cluster-wide gate of a pool.
//
// Slots are leases in a sorted set (member: process and job, score: expiry),
// renewed while the job runs. When taking a slot fills the pool, the same
// Lua call pauses the pool's queues (asynq's dequeue script skips a paused
// queue), so no process takes more jobs while the pool is full; when a slot
// frees, the call that frees it lifts that pause. The gate only ever lifts a
// pause it set itself (the key holds gatePauseValue); an operator's pause
// stays.
//
// Race window: a process that dequeued a job just before the pause was set
// finds no free slot. It does not put the job back (no churn, no
// reordering); it registers as a waiter and asks again when a "slot freed"
// message arrives, or every gateRetryEvery. A waiter, and any job asking for
// a slot, goes only if no better-placed waiter is ahead of it (higher tier
// first, then longer waiting) and no higher-tier job was dequeued without
// asking yet. A lower-tier job also gives way to pending higher-tier jobs,
// but only for gatePatience (so a process whose worker slots all hold such
// jobs cannot deadlock): docs/CLUSTER.md states what that bound allows.
// Waiters and leases both expire unless refreshed, so a killed process
// holds nothing for longer than GateLeaseTTL.
type gate struct {
	rdb        redis.UniversalClient
	pool       *Pool
	size       int
	leases     string
	waiting    string
	waitExp    string
	holders    string   // hash: member -> process holding it
	paused     []string // asynq's pause key of each queue, highest tier first
	pending    []string // asynq's pending list of each queue
	active     []string // asynq's active list of each queue
	asynqLease []string // asynq's lease set of each queue (scores: Unix seconds)
	queueArgs  []any    // the queue names, for the scripts
	processID  string

	wakeChannel string
	patience    time.Duration // see gatePatience

	mu   sync.Mutex
	held map[string]bool
	wake chan struct{} // closed when a slot may have freed somewhere

	waits      int64 // jobs that waited for a slot after being dequeued
	waitsTotal time.Duration
}

// processID names this process in lease members: host, pid and a random
// suffix (several runners in one process each get their own).
func newProcessID() string {
	host, _ := os.Hostname()
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

func newGate(rdb redis.UniversalClient, namespace string, p *Pool, processID string) *gate {
	leases, waiting := GateKeys(namespace, p.Name())
	g := &gate{
		rdb: rdb, pool: p, size: p.Size(), leases: leases, waiting: waiting, waitExp: waiting + ":expiry", holders: leases + ":holders",
		processID: processID, held: map[string]bool{}, wake: make(chan struct{}), wakeChannel: leases + ":freed",
		patience: gatePatience(p.Config().PollInterval),
	}
	for _, q := range p.Queues() {
		g.paused = append(g.paused, asynqPausedKey(q))
		g.pending = append(g.pending, asynqPendingKey(q))
		g.active = append(g.active, asynqActiveKey(q))
		g.asynqLease = append(g.asynqLease, asynqLeaseKey(q))
		g.queueArgs = append(g.queueArgs, q)
	}
	return g
}

// keys: leases, waiting, waitexp, holders, then per queue (highest tier
// first) its paused key, pending list, active list and lease set.
func (g *gate) keys() []string {
	keys := []string{g.leases, g.waiting, g.waitExp, g.holders}
	keys = append(keys, g.paused...)
	keys = append(keys, g.pending...)
	keys = append(keys, g.active...)
	return append(keys, g.asynqLease...)
}

// acquireScript (lua/gate_acquire.lua): KEYS as gate.keys. ARGV = now ms,
// size, member, lease expiry ms, waiter score, waiter expiry ms, tier index
// (1 = highest), n, process, now s, then the n queue names, then "1" while
// the job is patient. Returns {1, count} when the slot was taken, {0, count}
// when the caller must wait.
//
// Before a job may take a slot, no waiter may have a better place (higher
// tier, then earlier); no job of a higher tier may have just been dequeued
// without asking yet (a job in asynq's active list that holds no slot, is
// no waiter, and whose asynq lease is fresh, renewed in the last 5 s, so not
// left behind by a dead process); and, while the job is "patient" (the last
// ARGV), no higher tier may have a job pending in a queue not paused by
// hand. The last rule catches a lower-tier job that asynq dequeued because
// the gate lifted its pause between asynq's per-queue dequeue calls; it
// lapses after a while (see gatePatience) so that a process whose worker
// slots all hold such jobs cannot deadlock.
//
//go:embed lua/gate_acquire.lua
var acquireLua string

var acquireScript = redis.NewScript(acquireLua)

// releaseScript (lua/gate_release.lua): KEYS as gate.keys. ARGV = now ms,
// size, member (empty for the keeper's tick, which also drops expired leases
// and waiters), n, wake channel. Frees the member's slot and, when the pool
// has room, lifts the gate's pause and tells the waiters (PUBLISH); when
// full, sets the pause. Returns the count.
//
//go:embed lua/gate_release.lua
var releaseLua string

var releaseScript = redis.NewScript(releaseLua)

func nowMs() int64 { return time.Now().UnixMilli() }

// acquire takes a cluster-wide slot for the job, waiting (as a waiter, see
// gate) until it may. It returns the lease member to release.
func (g *gate) acquire(ctx context.Context, jobID, queue string) (string, error) {
	member := jobID + "@" + queue
	rank := g.pool.rank(queue)
	firstAt := time.Now()
	score := float64(rank)*1e13 + float64(firstAt.UnixMilli())
	var waitedSince time.Time
	for {
		wake := g.wakeCh() // taken before asking, so a wake-up in between is not missed
		now := nowMs()
		args := []any{now, g.size, member, now + GateLeaseTTL.Milliseconds(), score, now + GateLeaseTTL.Milliseconds(), rank, len(g.paused), g.processID, now / 1000}
		args = append(args, g.queueArgs...)
		patient := "0"
		if time.Since(firstAt) < g.patience {
			patient = "1"
		}
		args = append(args, patient)
		res, err := acquireScript.Run(context.WithoutCancel(ctx), g.rdb, g.keys(), args...).Int64Slice()
		if err != nil {
			return "", fmt.Errorf("pool %q: cluster-wide slot: %w", g.pool.Name(), err)
		}
		if res[0] == 1 {
			g.mu.Lock()
			g.held[member] = true
			if !waitedSince.IsZero() {
				g.waits++
				g.waitsTotal += time.Since(waitedSince)
			}
			g.mu.Unlock()
			return member, nil
		}
		if waitedSince.IsZero() {
			waitedSince = time.Now()
		}
		t := time.NewTimer(gateRetryEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			g.rdb.ZRem(context.WithoutCancel(ctx), g.waiting, member)
			g.rdb.ZRem(context.WithoutCancel(ctx), g.waitExp, member)
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

func (g *gate) tick(ctx context.Context, member string) {
	_ = releaseScript.Run(ctx, g.rdb, g.keys(), nowMs(), g.size, member, len(g.paused), g.wakeChannel).Err()
}

// renew extends the leases this process holds.
func (g *gate) renew(ctx context.Context) {
	g.mu.Lock()
	members := make([]redis.Z, 0, len(g.held))
	exp := float64(nowMs() + GateLeaseTTL.Milliseconds())
	for m := range g.held {
		members = append(members, redis.Z{Score: exp, Member: m})
	}
	g.mu.Unlock()
	if len(members) > 0 {
		g.rdb.ZAddXX(ctx, g.leases, members...)
	}
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
// that have not expired, by holder process (host:pid:id).
func ClusterSlots(ctx context.Context, rdb redis.UniversalClient, namespace, pool string) (active int, holders map[string]int, err error) {
	leases, _ := GateKeys(namespace, pool)
	members, err := rdb.ZRangeByScore(ctx, leases, &redis.ZRangeBy{Min: strconv.FormatInt(nowMs(), 10), Max: "+inf"}).Result()
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
