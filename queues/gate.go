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
	"strings"
	"sync"
	"sync/atomic"
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
// (its deadline came near, or the client is stopping). It is not a failure
// of the job: it goes back to its queue without using up a retry.
var errGateWait = errors.New("gave up waiting for a cluster-wide slot")

// errGateRedis marks a job that could not ask for a slot because Redis
// failed. It never ran: no retry is used up.
var errGateRedis = errors.New("could not reach Redis for a cluster-wide slot")

// gateGiveUpMargin is how long before a job's deadline a job waiting for a
// slot gives up, so that its own error, not asynq's deadline, is what asynq
// records: at most 5 s, at least 100 ms, a tenth of what is left otherwise.
func gateGiveUpMargin(left time.Duration) time.Duration {
	return max(100*time.Millisecond, min(5*time.Second, left/10))
}

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
	name        string // the pool's
	ks          keyspace
	leases      string
	waiting     string
	processID   string
	wakeChannel string
	now         func() time.Time // local durations only (stats)
	conf        atomic.Pointer[gateConf]

	// renewMu orders renewals against releases: a renewal's view of the
	// held slots and its script run as one step, so it never re-adds a slot
	// a release has just freed.
	renewMu sync.RWMutex

	mu         sync.Mutex
	held       map[string]bool
	wake       chan struct{} // closed when a slot may have freed somewhere
	stopping   chan struct{} // closed when the client stops: waiters give up
	stopOnce   sync.Once
	recovering bool      // a call to Redis failed: re-add held slots first
	lastOK     time.Time // the last call to Redis that succeeded (monotonic)
	serverID   string    // the run_id of the Redis node holding the pool's keys, "" when unknown
	// identify reads that run_id (redisRunID; tests replace it).
	identify   func(ctx context.Context) (string, error)
	waits      int64 // jobs that waited for a slot after being dequeued
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

func newGate(rdb redis.UniversalClient, ks keyspace, p *Pool, processID string, now func() time.Time) *gate {
	leases, waiting := ks.gateKeys(p.Name())
	g := &gate{
		rdb: rdb, name: p.Name(), ks: ks, leases: leases, waiting: waiting,
		processID: processID, held: map[string]bool{}, wake: make(chan struct{}), wakeChannel: leases + ":freed", now: now,
		stopping: make(chan struct{}), lastOK: time.Now(),
	}
	g.identify = func(ctx context.Context) (string, error) { return redisRunID(ctx, rdb, leases) }
	g.configure(p)
	return g
}

// gateConf is what the gate's scripts are given from the pool's config.
// A reconfiguration swaps it whole (gate.configure); each call to Redis
// reads one.
type gateConf struct {
	pool      *Pool
	size      int    // the configured size; an operator's resize in Redis wins (see lua/gate_lib.lua)
	strict    string // "1" for strict tiers
	keys      []string
	queueArgs []any  // the queue names, for the scripts
	rateArgs  []any  // the start rate's interval (ms) and burst; 0, 0 without one
	steering  string // reservations and maximum waits (Pool.steeringArg)
}

// configure derives every setting the gate takes from the pool's config,
// so that a reconfigured pool (Client.Reconfigure) is gated by its new
// settings from the next call on. Slots held stay held: their members
// name the job and its queue, not the settings.
func (g *gate) configure(p *Pool) {
	c := &gateConf{pool: p, size: p.Size(), strict: "0"}
	if p.cfg.QueueOrder == QueueOrderStrict {
		c.strict = "1"
	}
	c.keys = []string{g.leases, g.waiting, g.waiting + ":expiry", g.leases + ":holders", g.leases + ":grace"}
	qs := p.Queues()
	for _, f := range []func(string) string{asynqPausedKey, asynqPendingKey, asynqActiveKey, asynqLeaseKey} {
		for _, q := range qs {
			c.keys = append(c.keys, f(q))
		}
	}
	for _, q := range qs {
		c.queueArgs = append(c.queueArgs, q)
	}
	c.keys = append(c.keys, g.ks.startRateKey(p.Name()), g.ks.poolSizeKey(p.Name()))
	c.rateArgs = []any{0, 0}
	if r := p.cfg.StartRate; r != nil {
		c.rateArgs = []any{strconv.FormatFloat(float64(r.interval())/float64(time.Millisecond), 'f', -1, 64), r.Burst}
	}
	c.keys = append(c.keys, g.ks.gateAgedKey(p.Name()))
	c.steering = p.steeringArg()
	g.conf.Store(c)
}

//go:embed lua/gate_lib.lua
var gateLib string

//go:embed lua/gate_acquire.lua
var acquireLua string

//go:embed lua/gate_release.lua
var releaseLua string

//go:embed lua/gate_renew.lua
var renewLua string

//go:embed lua/gate_clear.lua
var clearLua string

// The gate's scripts, each with the shared functions of gate_lib.lua in
// front; their KEYS and ARGV are described at the top of each file.
var (
	acquireScript = redis.NewScript(gateLib + acquireLua)
	releaseScript = redis.NewScript(gateLib + releaseLua)
	renewScript   = redis.NewScript(gateLib + renewLua)
	clearScript   = redis.NewScript(clearLua)
)

// acquire takes a cluster-wide slot for the job, waiting (as a waiter, see
// gate) until it may, or until shortly before the job's deadline. It
// returns the lease member to release.
func (g *gate) acquire(ctx context.Context, jobID, queue string) (string, error) {
	return g.acquireReady(ctx, jobID, queue, time.Time{})
}

// acquireReady is acquire for a job first ready to run at ready (the zero
// time: unknown), which the starvation guard counts its wait from.
func (g *gate) acquireReady(ctx context.Context, jobID, queue string, ready time.Time) (string, error) {
	member := jobID + "@" + queue
	readyMs := int64(0)
	if !ready.IsZero() {
		readyMs = ready.UnixMilli()
	}
	giveUp := time.Time{}
	if deadline, ok := ctx.Deadline(); ok {
		giveUp = deadline.Add(-gateGiveUpMargin(time.Until(deadline)))
	}
	var waitedSince time.Time
	for {
		wake := g.wakeCh() // taken before asking, so a wake-up in between is not missed
		if err := g.recover(ctx); err != nil {
			return "", fmt.Errorf("pool %q: %w: %w", g.name, errGateRedis, err)
		}
		c := g.conf.Load()
		args := []any{c.size, member, c.pool.rank(queue), len(c.queueArgs), g.processID, GateLeaseTTL.Milliseconds(), c.strict}
		args = append(args, c.queueArgs...)
		args = append(args, c.rateArgs...)
		args = append(args, c.steering, readyMs)
		res, err := acquireScript.Run(context.WithoutCancel(ctx), g.rdb, c.keys, args...).Int64Slice()
		if err != nil {
			g.failed(ctx)
			return "", fmt.Errorf("pool %q: %w: %w", g.name, errGateRedis, err)
		}
		g.ok()
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
		wait := gateRetryEvery
		if res[2] > 0 {
			// The start rate allows this start then: ask again exactly
			// then, so starts keep to the rate.
			wait = time.Duration(res[2]) * time.Millisecond
		}
		if !giveUp.IsZero() {
			wait = min(wait, time.Until(giveUp))
		}
		t := time.NewTimer(max(wait, 0))
		var why string
		select {
		case <-ctx.Done():
			why = ctx.Err().Error()
		case <-g.stopping:
			why = "the client is stopping"
		case <-wake:
		case <-t.C:
			if !giveUp.IsZero() && !time.Now().Before(giveUp) {
				why = "the job's deadline is near"
			}
		}
		t.Stop()
		if why != "" {
			bg := context.WithoutCancel(ctx)
			g.rdb.ZRem(bg, g.waiting, member)
			g.rdb.ZRem(bg, g.waiting+":expiry", member)
			return "", fmt.Errorf("pool %q: %w: %s", g.name, errGateWait, why)
		}
	}
}

// stopWaiting makes every job waiting for a slot give up: the client is
// stopping and will not run them.
func (g *gate) stopWaiting() { g.stopOnce.Do(func() { close(g.stopping) }) }

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

// release frees a slot. The read lock covers only taking the slot out of
// the held set: a renewal (which takes its view of the set and runs its
// script under the write lock) then either ran before, or never sees the
// slot. The tick runs outside the lock, since after a failed call its
// recovery takes the write lock itself.
func (g *gate) release(ctx context.Context, member string) {
	g.renewMu.RLock()
	g.mu.Lock()
	delete(g.held, member)
	g.mu.Unlock()
	g.renewMu.RUnlock()
	g.tick(context.WithoutCancel(ctx), member)
}

// tick frees member's slot, or with member "" drops what dead processes
// left behind; either way it settles the pause flags.
func (g *gate) tick(ctx context.Context, member string) {
	if g.recover(ctx) != nil {
		return
	}
	if err := g.release1(ctx, member); err != nil {
		g.failed(ctx)
		return
	}
	g.ok()
}

// settle sets the pause flags for the slots in use now, before the pool's
// server starts: the keeper's tick, at once.
func (g *gate) settle(ctx context.Context) error { return g.release1(ctx, "") }

// release1 runs the release script once: it frees member's slot (none for
// "") and settles the pause flags.
func (g *gate) release1(ctx context.Context, member string) error {
	c := g.conf.Load()
	return releaseScript.Run(ctx, g.rdb, c.keys, c.size, member, len(c.queueArgs), g.wakeChannel, c.strict, c.rateArgs[0], c.rateArgs[1], c.steering).Err()
}

// clearGatePauses lifts the pauses a gate left on the queues of a pool that
// runs without one (its scope changed to process): nothing else would.
func clearGatePauses(ctx context.Context, rdb redis.UniversalClient, p *Pool) error {
	keys := make([]string, 0, len(p.queues))
	for _, q := range p.queues {
		keys = append(keys, asynqPausedKey(q))
	}
	return clearScript.Run(ctx, rdb, keys).Err()
}

// failed notes that a call to Redis failed: the held slots may have lapsed
// by the time Redis answers again. The gate's own stop is no failure.
func (g *gate) failed(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	g.mu.Lock()
	g.recovering = true
	g.mu.Unlock()
}

// ok notes a call to Redis that succeeded.
func (g *gate) ok() {
	g.mu.Lock()
	g.lastOK = time.Now()
	g.mu.Unlock()
}

// renew extends the leases this process holds.
func (g *gate) renew(ctx context.Context) {
	if err := g.renewHeld(ctx, false, false); err != nil {
		g.failed(ctx)
		return
	}
	g.ok()
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

// redisRunID returns the run_id of the Redis server that holds key (on a
// cluster, the master of key's slot), or "" when it reports none.
func redisRunID(ctx context.Context, rdb redis.UniversalClient, key string) (string, error) {
	var info *redis.StringCmd
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return "", err
		}
		info = node.Info(ctx, "server")
	} else {
		info = rdb.Info(ctx, "server")
	}
	text, err := info.Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return v, nil
		}
	}
	return "", nil
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
	mode := "XX"
	if recovering {
		mode = "ADD"
	}
	args := make([]any, 0, 4+len(g.held))
	args = append(args, GateLeaseTTL.Milliseconds(), g.processID, grace.Milliseconds(), mode)
	for m := range g.held {
		args = append(args, m)
	}
	g.mu.Unlock()
	if len(args) == 4 && grace == 0 {
		return nil
	}
	return renewScript.Run(ctx, g.rdb, g.conf.Load().keys, args...).Err()
}

// run renews leases, keeps the gate clean and relays "a slot freed"
// messages to the local waiters until ctx ends.
func (g *gate) run(ctx context.Context) {
	sub := g.rdb.Subscribe(ctx, g.wakeChannel)
	relayed := make(chan struct{})
	go func() {
		defer close(relayed)
		for range sub.Channel() {
			g.broadcast()
		}
	}()
	defer func() {
		_ = sub.Close() // ends the relay's channel
		<-relayed
	}()
	g.learnServer(ctx)
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
	leases, _ := newKeyspace(namespace, rdb).gateKeys(pool)
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
