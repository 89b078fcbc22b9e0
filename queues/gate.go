package queues

import (
	"cmp"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/queues/internal/rdb"
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
	gatePauseValue = rdb.GatePause
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
// skips a paused queue): with strict tiers, open only down to the highest
// tier that has pending jobs, so that no process can take a lower tier's
// job while a higher one waits; all paused while the pool is full when it
// has steering or a start rate, otherwise only once many jobs wait (see
// lua/gate_lib.lua, settle). The gate only ever lifts a pause it set
// itself (the key holds gatePauseValue); an operator's pause stays.
//
// Jobs taken ahead of a slot (the look-ahead, PoolConfig.lookAhead, or
// the race before a pause) are not put back (no churn, no reordering):
// each registers as a waiter, and a release hands a freed slot to the best
// waiter at once, in whichever process it waits (the reply or a message on
// the wake channel tells it); it also asks again on "ask again" or every
// gateRetryEvery. A waiter, and any job asking for a slot, goes only if no
// better-placed live waiter is ahead of it (higher tier first, then longer
// waiting) and no higher-tier job was dequeued without asking yet. A
// process's releases and questions go to Redis together (submit). Waiters
// and leases both expire unless refreshed, so a killed process holds
// nothing for longer than GateLeaseTTL. After a Redis outage a process
// re-adds the slots of the jobs it still runs before anything new is
// admitted (gateRecoveryGrace). docs/CLUSTER.md states what remains.
type gate struct {
	rdb         redis.UniversalClient
	name        string // the pool's
	ks          rdb.Keyspace
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

	mu       sync.Mutex
	held     map[string]bool
	waiters  map[string]*localWaiter // jobs of this process waiting for a slot (acquire)
	wake     chan struct{}           // closed when a slot may have freed somewhere
	stopping chan struct{}           // closed when the client stops: waiters give up
	stopOnce sync.Once
	// handOff is what the last step reply said about handing a slot from
	// a job that ends to a job waiting in this process (handOffLocked).
	handOff handOffView
	// handOffSlack is gateHandOffSlack (tests change it).
	handOffSlack time.Duration
	// handing holds the hand-offs Redis has not heard of yet (sent and
	// answered), by the member handed to: set when the waiter is picked
	// (handOffLocked), so that the job's own release, however soon it
	// comes, waits for it (awaitHandOff).
	handing map[string]*gateOp
	// bmu guards the ops waiting to go to Redis together (submit).
	bmu      sync.Mutex
	queue    []*gateOp
	inFlight int
	full     bool   // the pool was full at the last step's reply
	lazyDue  bool   // a timer will send the releases held back (releaseLater)
	calls    uint64 // step calls made; each reply is applied only over an older one's
	fullAt   uint64 // the call whose reply set full

	recovering bool      // a call to Redis failed: re-add held slots first
	failures   uint64    // calls to Redis that failed (failed): a reply to a call made before one says nothing of now
	lastOK     time.Time // the last call to Redis that succeeded (monotonic)
	serverID   string    // the run_id of the Redis node holding the pool's keys, "" when unknown
	// identify reads that run_id (redisRunID; tests replace it).
	identify   func(ctx context.Context) (string, error)
	waits      int64 // jobs that waited for a slot after being dequeued
	waitsTotal time.Duration

	// log, when set, hears when the pool's size in effect is more than the
	// live worker processes can run between them (announce).
	log *slog.Logger
	// shortfall is the last such state logged: size and capacity, or
	// zeros when there was none.
	shortfall [2]int64
}

// newProcessID names this process in lease holders: host, pid and a random
// suffix (several clients in one process each get their own).
func newProcessID() string {
	host, _ := os.Hostname()
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

func newGate(rc redis.UniversalClient, ks rdb.Keyspace, p *Pool, processID string, now func() time.Time) *gate {
	leases, waiting := ks.GateKeys(p.Name())
	g := &gate{
		rdb: rc, name: p.Name(), ks: ks, leases: leases, waiting: waiting,
		processID: processID, held: map[string]bool{}, waiters: map[string]*localWaiter{}, handing: map[string]*gateOp{}, wake: make(chan struct{}), wakeChannel: leases + ":freed", now: now,
		stopping: make(chan struct{}), lastOK: time.Now(), handOffSlack: gateHandOffSlack,
	}
	g.identify = func(ctx context.Context) (string, error) { return redisRunID(ctx, rc, leases) }
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
	// holdRelease: a release may wait for another call to carry it
	// (releaseLater). Not with steering or a start rate: their rules need
	// a freed slot seen at once, as their pause when full does.
	holdRelease bool
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
	for _, f := range []func(string) string{rdb.PausedKey, rdb.PendingKey, rdb.ActiveKey, rdb.LeaseKey} {
		for _, q := range qs {
			c.keys = append(c.keys, f(q))
		}
	}
	for _, q := range qs {
		c.queueArgs = append(c.queueArgs, q)
	}
	c.keys = append(c.keys, g.ks.StartRateKey(p.Name()), g.ks.PoolSizeKey(p.Name()))
	c.rateArgs = []any{0, 0}
	if r := p.cfg.StartRate; r != nil {
		c.rateArgs = []any{strconv.FormatFloat(float64(r.interval())/float64(time.Millisecond), 'f', -1, 64), r.Burst}
	}
	c.keys = append(c.keys, g.ks.GateAgedKey(p.Name()))
	c.keys = append(c.keys, g.waiting+":procs") // last, always (lua/gate_lib.lua)
	c.steering = p.steeringArg()
	c.holdRelease = !p.cfg.pausesWhenFull()
	g.conf.Store(c)
}

//go:embed lua/gate_lib.lua
var gateLib string

//go:embed lua/gate_step.lua
var stepLua string

//go:embed lua/gate_release.lua
var releaseLua string

//go:embed lua/gate_renew.lua
var renewLua string

//go:embed lua/gate_clear.lua
var clearLua string

// The gate's scripts, each with the shared functions of gate_lib.lua in
// front; their KEYS and ARGV are described at the top of each file.
var (
	stepScript    = redis.NewScript(gateLib + stepLua)
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
	var me *localWaiter // set once the job is registered as waiting here
	defer func() {
		if me != nil {
			g.mu.Lock()
			delete(g.waiters, member)
			g.mu.Unlock()
		}
	}()
	for {
		wake := g.wakeCh() // taken before asking, so a wake-up in between is not missed
		if err := g.recover(ctx); err != nil {
			if me != nil && g.claimed(member) {
				// A job of this process handed it its slot meanwhile.
				g.took(member, waitedSince)
				return member, nil
			}
			return "", fmt.Errorf("pool %q: %w: %w", g.name, errGateRedis, err)
		}
		if me == nil && g.takeHeldRelease(member) {
			g.took(member, time.Time{})
			return member, nil
		}
		if me == nil {
			// Registered before asking: a release may hand this job a slot
			// the moment the script below makes it a waiter, or, in this
			// process, before its question is even sent (handOffLocked).
			c := g.conf.Load()
			rank := 1
			if c.strict == "1" {
				rank = c.pool.rank(queue)
			}
			me = &localWaiter{member: member, ch: make(chan struct{}, 1), rank: rank, since: time.Now()}
			g.mu.Lock()
			g.waiters[member] = me
			g.mu.Unlock()
		}
		res := g.submit(&gateOp{ask: member, queue: queue, ready: readyMs})
		if res.err != nil {
			g.failed(ctx)
			if g.claimed(member) {
				// A job of this process handed it its slot meanwhile.
				g.took(member, waitedSince)
				return member, nil
			}
			return "", fmt.Errorf("pool %q: %w: %w", g.name, errGateRedis, res.err)
		}
		g.ok()
		if res.taken {
			g.took(member, waitedSince)
			return member, nil
		}
		if waitedSince.IsZero() {
			waitedSince = g.now()
		}
		wait := gateRetryEvery
		if res.wait > 0 {
			// The start rate allows this start then: ask again exactly
			// then, so starts keep to the rate.
			wait = res.wait
		}
		if !giveUp.IsZero() {
			wait = min(wait, time.Until(giveUp))
		}
		t := time.NewTimer(max(wait, 0))
		var why string
		select {
		case <-me.ch:
			// A release handed this job a slot: its lease is written (or,
			// handed on in this process, on its way), held by this
			// process.
			t.Stop()
			g.took(member, waitedSince)
			return member, nil
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
			// Leave the waiters; a slot a release handed this job in the
			// meantime through Redis is freed (and handed on) in the same
			// call. One handed on by a job of this process (handOffLocked)
			// is already on its way to Redis as this job's: the job runs.
			if g.claimed(member) {
				g.took(member, waitedSince)
				return member, nil
			}
			if _, err := g.release1(context.WithoutCancel(ctx), member); err != nil {
				g.failed(ctx)
			}
			return "", fmt.Errorf("pool %q: %w: %s", g.name, errGateWait, why)
		}
	}
}

// claimed takes member out of this process's waiters and says whether a
// job of this process had handed it its slot already (handOffLocked takes
// a waiter it hands a slot to out of the waiters itself): from then on
// that slot is the job's, and only its release frees it.
func (g *gate) claimed(member string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, waiting := g.waiters[member]
	delete(g.waiters, member)
	return !waiting
}

// took notes that member holds a slot now, and how long it waited for it
// (waitedSince is zero when it did not wait).
func (g *gate) took(member string, waitedSince time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held[member] = true
	if !waitedSince.IsZero() {
		g.waits++
		g.waitsTotal += g.now().Sub(waitedSince)
	}
}

// grant tells this process's waiter member that a release handed it a
// slot. A member that no longer waits here (it gave up) is ignored: its
// give-up freed the slot, or will.
func (g *gate) grant(member string) {
	g.mu.Lock()
	w := g.waiters[member]
	g.mu.Unlock()
	if w != nil {
		w.tell()
	}
}

// relay handles a message on the wake channel: "1" wakes every local
// waiter to ask again; "g" and lines "process<TAB>member" hand slots to
// waiters, of which this process's are told.
func (g *gate) relay(payload string) {
	if payload == "1" {
		g.broadcast()
		return
	}
	rest, ok := strings.CutPrefix(payload, "g\n")
	if !ok {
		g.broadcast() // unknown: asking again is always safe
		return
	}
	for line := range strings.SplitSeq(rest, "\n") {
		if proc, member, ok := strings.Cut(line, "\t"); ok && proc == g.processID {
			g.grant(member)
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

// release frees a slot, or hands it to a job waiting in this process
// (handOffLocked). The read lock covers only taking the slot out of the
// held set (and, on a hand-off, putting the next job's in): a renewal
// (which takes its view of the set and runs its script under the write
// lock) then either ran before, or never sees the slot. The tick runs
// outside the lock, since after a failed call its recovery takes the write
// lock itself.
func (g *gate) release(ctx context.Context, member string) {
	if g.unhand(member) {
		g.flush(false)
		return
	}
	g.awaitHandOff(member)
	g.renewMu.RLock()
	g.mu.Lock()
	delete(g.held, member)
	next, op := g.handOffLocked(member)
	g.mu.Unlock()
	g.renewMu.RUnlock()
	if next != nil {
		g.handTo(next, op)
		return
	}
	g.tick(context.WithoutCancel(ctx), member)
}

// localWaiter is a job of this process waiting for a slot (acquire).
type localWaiter struct {
	member string
	ch     chan struct{} // told when a release hands it a slot
	rank   int           // its tier's rank with strict tiers, else 1: how the gate orders waiters
	since  time.Time     // when it first asked
}

// tell wakes the waiter with a slot (once: a second grant is the same slot).
func (w *localWaiter) tell() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// handOffView is what the last step reply said that a hand-off in this
// process needs: whether the pool was exactly full, and the best live
// waiter of another process then, if any (handOffLocked); whether it had
// room and nobody waited (takeHeldRelease).
type handOffView struct {
	ok        bool          // exactly full, a pool without steering or a start rate, no recovery grace
	room      bool          // room, nobody waiting, no steering or start rate, no recovery grace
	otherRank int           // the best other process's waiter's rank (0: none)
	otherAge  time.Duration // how long it had waited at the reply
	at        time.Time     // when the reply came
	call      uint64        // the call it answered
}

// takeHeldRelease gives member the slot of a job of this process that
// ended while the pool had room, when that job's release is still held
// back (releaseLater) and nobody waited for a slot anywhere at the last
// reply: the held release becomes a hand-off to member (it still goes
// with the process's next call, or on its own 1 ms after it was made),
// and member starts with no call to Redis. Short jobs that never fill the
// pool thus make one call to the gate for several jobs. The count never
// moves, so the cap holds whatever happened since the reply; a job that
// began waiting elsewhere since then may see one such slot go by.
func (g *gate) takeHeldRelease(member string) bool {
	if !g.conf.Load().holdRelease {
		return false
	}
	g.bmu.Lock()
	defer g.bmu.Unlock()
	var held *gateOp
	for _, op := range g.queue {
		if op.lazy && op.to == "" {
			held = op
			break
		}
	}
	if held == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.handOff.room || g.recovering || g.isStopping() {
		return false
	}
	held.to, held.toNew = member, true
	g.held[member] = true
	g.handing[member] = held
	return true
}

// unhand takes member's slot back out of the hand-off that gave it to
// member, when that op is still queued (Redis has not heard of it) and
// member never asked Redis for a slot itself (takeHeldRelease; a waiter
// handed a slot by handTo may hold a lease or a place that its release
// must free): the op goes back to being the release of the job that ended
// before member (held back or not, as it was), and Redis never sees
// member's lease. It says whether it did; otherwise member's release goes
// its usual way.
func (g *gate) unhand(member string) bool {
	g.renewMu.RLock()
	defer g.renewMu.RUnlock()
	g.bmu.Lock()
	defer g.bmu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	op := g.handing[member]
	if op == nil || !op.toNew || !slices.Contains(g.queue, op) {
		return false
	}
	op.to, op.toNew = "", false
	delete(g.handing, member)
	delete(g.held, member)
	return true
}

// isStopping says whether the client is stopping.
func (g *gate) isStopping() bool {
	select {
	case <-g.stopping:
		return true
	default:
		return false
	}
}

// awaitHandOff waits, when member's slot was handed to it in this process
// (handTo) and Redis has not heard of that yet, until it has: the
// release of member must reach Redis after the op that writes its lease,
// or that op would write it again after the release (a slot held by no
// job until its lease expired). Two calls of one process may be in flight
// at once, so order among them is not otherwise kept.
func (g *gate) awaitHandOff(member string) {
	g.mu.Lock()
	op := g.handing[member]
	g.mu.Unlock()
	if op == nil {
		return
	}
	g.flush(true)
	r := <-op.done
	op.done <- r // for any other reader
}

// gateHandOffSlack is how much longer than a job waiting in this process
// another process's job of the same tier may have waited, for a slot
// freed here to go to this process's job without a call to Redis
// (handOffLocked). It bounds how far start order may stray from first
// come, first served across processes within a tier, and it lets each
// process keep handing its own slots on while the processes' waits are
// about even: a process whose jobs wait longer gets the next slots freed
// elsewhere, through Redis, until they are.
const gateHandOffSlack = 5 * time.Millisecond

// handOffLocked picks the job of this process that takes the slot of
// member, a job that ends here, when it may take it with no call to Redis first (g.mu
// held): the pool was exactly full at the last reply, so a freed slot goes
// to a waiter anyway, and this process's best waiter is the one the gate
// would choose, give or take gateHandOffSlack: no other process's waiter
// was of a higher tier, nor of the same tier and waiting longer by more
// than the slack. It takes the job out of the waiters, notes its slot as
// held and makes the op that tells Redis, which the caller queues (handTo)
// before it tells the job. None (nil) for a
// pool with steering or a start rate (their rules see every slot freed),
// while a recovery is due, or once the client stops.
func (g *gate) handOffLocked(member string) (*localWaiter, *gateOp) {
	v := g.handOff
	if !v.ok || g.recovering || len(g.waiters) == 0 || !g.conf.Load().holdRelease || g.isStopping() {
		return nil, nil
	}
	var best *localWaiter
	for _, w := range g.waiters {
		if best == nil || w.rank < best.rank || (w.rank == best.rank && w.since.Before(best.since)) {
			best = w
		}
	}
	if v.otherRank > 0 {
		if best.rank > v.otherRank {
			return nil, nil
		}
		if best.rank == v.otherRank && v.otherAge+time.Since(v.at)-time.Since(best.since) > g.handOffSlack {
			return nil, nil
		}
	}
	delete(g.waiters, best.member)
	g.held[best.member] = true
	op := &gateOp{release: member, to: best.member, since: time.Now(), done: make(chan gateReply, 1)}
	g.handing[best.member] = op
	return best, op
}

// handTo hands the slot of a job of this process that ended to next, a
// job waiting here (handOffLocked): next starts now, and op tells Redis
// that the slot is next's (the step script frees the ended job's lease and
// writes next's in the same call, so the count never moves). A question
// next had queued and not sent yet is answered here instead.
func (g *gate) handTo(next *localWaiter, op *gateOp) {
	g.bmu.Lock()
	var ask *gateOp
	for i, op := range g.queue {
		if op.ask == next.member {
			ask = op
			g.queue = slices.Delete(g.queue, i, i+1)
			break
		}
	}
	g.queue = append(g.queue, op)
	g.bmu.Unlock()
	if ask != nil {
		ask.done <- gateReply{taken: true}
	} else {
		next.tell()
	}
	g.flush(false)
}

// tick frees member's slot, or with member "" drops what dead processes
// left behind; either way it settles the pause flags.
func (g *gate) tick(ctx context.Context, member string) {
	if g.recover(ctx) != nil {
		return
	}
	var err error
	switch {
	case member == "":
		_, err = g.release1(ctx, member)
	case g.releaseLater(member):
		return
	default:
		err = g.submit(&gateOp{release: member}).err
	}
	if err != nil {
		g.failed(ctx)
		return
	}
	g.ok()
}

// Sharing calls to Redis among the jobs of one process.
const (
	// gateMaxInFlight is how many calls to the step script one process
	// makes at once per pool; what jobs ask meanwhile goes together in the
	// next.
	gateMaxInFlight = 2
	// gateHoldAsk is how long a job taken from its queue while the pool
	// is full (as the last reply said) and this process runs jobs of the
	// pool may wait before it asks for a slot, so that its question goes
	// in the same call as the release of a job that ends here: one call
	// instead of two.
	gateHoldAsk = 2 * time.Millisecond
	// gateHoldRelease is how long the release of a job that ended while
	// the pool had room (at the last reply) may wait for another call of
	// this process to carry it, typically the question of the job this
	// process takes next: one call instead of two. Nobody waits for such a
	// slot (the pool had free ones), and holding a slot a moment longer
	// never lets more jobs run than the size.
	gateHoldRelease = time.Millisecond
)

// gateOp is one thing a job asks of the gate: to free a slot, or to take
// one (ask).
type gateOp struct {
	release string // a member whose slot (or place among the waiters) to free
	to      string // a member of this process the slot is handed to (handTo, takeHeldRelease)
	toNew   bool   // to never asked Redis for a slot (takeHeldRelease): this op is all Redis will know of it
	lazy    bool   // a release nobody waits for (releaseLater)
	ask     string // a member asking for a slot
	queue   string // the asking job's queue
	ready   int64  // when the asking job was first ready to run, ms (0: unknown)
	since   time.Time
	done    chan gateReply
}

// gateReply is what the step script said to one op.
type gateReply struct {
	taken bool          // the asking job took a slot
	wait  time.Duration // when the start rate allows its start (0: now or no rate)
	err   error
}

// submit queues op and returns its reply. The ops of one process go to
// Redis together, gateMaxInFlight calls at a time (flush): a job's op
// either starts a call or joins the next. An ask that could only wait (the
// pool was full at the last reply and a job of this process will end
// soon) is held up to gateHoldAsk for a release to carry it.
func (g *gate) submit(op *gateOp) gateReply {
	op.done = make(chan gateReply, 1)
	op.since = time.Now()
	g.bmu.Lock()
	g.queue = append(g.queue, op)
	g.bmu.Unlock()
	g.flush(false)
	if op.ask == "" {
		return <-op.done
	}
	t := time.NewTimer(gateHoldAsk)
	defer t.Stop()
	select {
	case r := <-op.done:
		return r
	case <-t.C:
		g.flush(true)
		return <-op.done
	}
}

// releaseLater queues the release of member's slot without waiting for
// it, when the pool had room at the last reply: it goes with the next call
// this process makes, or on its own gateHoldRelease later. It returns
// false, and queues nothing, when the pool was full (waiting jobs need the
// slot now) or has steering or a start rate.
func (g *gate) releaseLater(member string) bool {
	if !g.conf.Load().holdRelease {
		return false
	}
	g.bmu.Lock()
	defer g.bmu.Unlock()
	if g.full {
		return false
	}
	g.queue = append(g.queue, &gateOp{release: member, lazy: true, since: time.Now(), done: make(chan gateReply, 1)})
	if !g.lazyDue {
		g.lazyDue = true
		time.AfterFunc(gateHoldRelease, func() {
			// From here the held releases are sendable (sendable): this
			// flush sends them, or, while gateMaxInFlight calls are in
			// flight, the first of them to end does.
			g.bmu.Lock()
			g.lazyDue = false
			g.bmu.Unlock()
			g.flush(false)
		})
	}
	return true
}

// sendOps sends every queued op and waits until none is in flight, up to
// a second: at a stop, so that no release held back (releaseLater) is
// left behind to hold its slot until its lease expires.
func (g *gate) sendOps() {
	deadline := time.Now().Add(time.Second)
	for {
		g.flush(true)
		g.bmu.Lock()
		idle := len(g.queue) == 0 && g.inFlight == 0
		g.bmu.Unlock()
		if idle || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// flush sends the queued ops while fewer than gateMaxInFlight calls are
// in flight: at once when one frees a slot, when the pool had room at the
// last reply, when this process holds no slot (no release will come), or
// when an ask was held long enough (force, or its age).
func (g *gate) flush(force bool) {
	for {
		g.bmu.Lock()
		if len(g.queue) == 0 || g.inFlight >= gateMaxInFlight || !(force || g.sendable()) {
			g.bmu.Unlock()
			return
		}
		batch := g.queue
		g.queue = nil
		g.inFlight++
		g.calls++
		call := g.calls
		g.mu.Lock()
		failures := g.failures
		g.mu.Unlock()
		g.bmu.Unlock()
		g.runStep(batch, call, failures)
		g.bmu.Lock()
		g.inFlight--
		g.bmu.Unlock()
		force = false
	}
}

// sendable says whether the queued ops should go now (bmu held). A
// release goes at once, unless it was held back (releaseLater), the pool
// still has room and the timer that sends it is still due. A question goes
// at once while the pool has room (at the last reply) or this process
// holds no slot (no release of its own will come to carry it), else once
// it has waited gateHoldAsk.
func (g *gate) sendable() bool {
	holding := -1
	for _, op := range g.queue {
		if op.ask == "" {
			// A held release goes once no timer is due to send it (its
			// timer fired, or none was armed for it), so none is left
			// behind by a timer that found the calls in flight.
			if !op.lazy || g.full || !g.lazyDue || time.Since(op.since) >= gateHoldRelease {
				return true
			}
			continue
		}
		if !g.full || time.Since(op.since) >= gateHoldAsk {
			return true
		}
		if holding < 0 {
			g.mu.Lock()
			holding = len(g.held)
			g.mu.Unlock()
		}
		if holding == 0 {
			return true
		}
	}
	return false
}

// runStep runs the step script for batch, the process's call-th call, made
// after failures calls to Redis had failed, and hands each op its reply.
// What the reply says of the pool (full, the hand-off view) replaces only
// what an older call's reply said: with two calls in flight, replies may
// come back out of order. The hand-off view is not taken from a call made
// before a failure: the pool's state then says nothing of what a recovery
// finds.
func (g *gate) runStep(batch []*gateOp, call, failures uint64) {
	c := g.conf.Load()
	args := []any{c.size, len(c.queueArgs), g.processID, GateLeaseTTL.Milliseconds(), c.strict, g.wakeChannel, c.rateArgs[0], c.rateArgs[1], c.steering}
	var asks []*gateOp
	var freed []any // pairs: the member freed, the member it is handed to ("": none)
	for _, op := range batch {
		if op.ask != "" {
			asks = append(asks, op)
		} else {
			freed = append(freed, op.release, op.to)
		}
	}
	// Jobs that ask together ask in their tier's order, then in the order
	// they were enqueued (when known), which is the order asynq took them
	// in, whatever order their goroutines reached the gate.
	slices.SortStableFunc(asks, func(a, b *gateOp) int {
		if ra, rb := c.pool.rank(a.queue), c.pool.rank(b.queue); ra != rb {
			return ra - rb
		}
		if a.ready == 0 || b.ready == 0 {
			return 0
		}
		return cmp.Compare(a.ready, b.ready)
	})
	args = append(args, len(freed)/2)
	args = append(args, freed...)
	for _, op := range asks {
		args = append(args, op.ask, c.pool.rank(op.queue), op.ready)
	}
	res, err := stepScript.Run(context.Background(), g.rdb, c.keys, args...).Slice()
	if err == nil && (len(res) < 5+2*len(asks)) {
		err = fmt.Errorf("gate step: unexpected reply of %d values", len(res))
	}
	if err != nil {
		g.mu.Lock()
		g.handOff.ok, g.handOff.room = false, false
		g.mu.Unlock()
		unheard := false
		for _, op := range batch {
			op.done <- gateReply{err: err}
			unheard = unheard || op.lazy || op.to != ""
		}
		g.handedOn(batch)
		if unheard {
			// Nobody waits for these releases and hand-offs: note the
			// failure here, so that the next call re-adds what this
			// process still holds (recover), the jobs slots were handed
			// to among them; the slots freed stay taken until their
			// leases expire, as after any failed release.
			g.failed(context.Background())
		}
		return
	}
	count, _ := res[0].(int64)
	size, _ := res[2].(int64) // an operator's resize wins over c.size
	otherRank, _ := res[3].(int64)
	otherAge, _ := res[4].(int64)
	g.bmu.Lock()
	if call > g.fullAt {
		g.full, g.fullAt = count >= size, call
	}
	g.bmu.Unlock()
	g.mu.Lock()
	if call > g.handOff.call && failures == g.failures {
		g.handOff = handOffView{
			ok: count == size && otherRank >= 0 && !g.recovering, otherRank: int(otherRank),
			room:     count < size && otherRank == 0 && !g.recovering,
			otherAge: time.Duration(otherAge) * time.Millisecond, at: time.Now(), call: call,
		}
	}
	g.mu.Unlock()
	i := 5
	for _, op := range asks {
		taken, _ := res[i].(int64)
		wait, _ := res[i+1].(int64)
		op.done <- gateReply{taken: taken == 1, wait: time.Duration(wait) * time.Millisecond}
		i += 2
	}
	for _, m := range res[i:] {
		if s, ok := m.(string); ok {
			g.grant(s)
		}
	}
	g.handedOn(batch)
	for _, op := range batch {
		if op.ask == "" {
			op.done <- gateReply{}
		}
	}
}

// handedOn forgets the hand-offs of batch (handTo) once Redis has heard of
// them, or failed to: the jobs they went to may free their slots now
// (awaitHandOff).
func (g *gate) handedOn(batch []*gateOp) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, op := range batch {
		if op.to != "" && g.handing[op.to] == op {
			delete(g.handing, op.to)
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
func (g *gate) release1(ctx context.Context, member string) (int64, error) {
	c := g.conf.Load()
	res, err := releaseScript.Run(ctx, g.rdb, c.keys, c.size, member, len(c.queueArgs), g.wakeChannel, c.strict, c.rateArgs[0], c.rateArgs[1], c.steering,
		GateLeaseTTL.Milliseconds(), g.processID).Slice()
	if err != nil {
		return 0, err
	}
	for _, m := range res[1:] {
		if s, ok := m.(string); ok {
			g.grant(s)
		}
	}
	n, _ := res[0].(int64)
	return n, nil
}

// clearGatePauses lifts the pauses a gate left on the queues of a pool that
// runs without one (its scope changed to process): nothing else would.
func clearGatePauses(ctx context.Context, rc redis.UniversalClient, p *Pool) error {
	keys := make([]string, 0, len(p.queues))
	for _, q := range p.queues {
		keys = append(keys, rdb.PausedKey(q))
	}
	return clearScript.Run(ctx, rc, keys).Err()
}

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
func redisRunID(ctx context.Context, rc redis.UniversalClient, key string) (string, error) {
	var info *redis.StringCmd
	if cc, ok := rc.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return "", err
		}
		info = node.Info(ctx, "server")
	} else {
		info = rc.Info(ctx, "server")
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
		// The jobs slots were handed to whose ops Redis has not heard of
		// are re-added too (they are held): from here on their releases
		// must go after those ops, never be taken back out of them (unhand),
		// or the lease re-added here would stay behind them.
		for _, op := range g.handing {
			op.toNew = false
		}
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
		for msg := range sub.Channel() {
			g.relay(msg.Payload)
		}
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
			g.tick(ctx, "")
		}
	}
}

//go:embed lua/gate_announce.lua
var announceLua string

// announceScript: a process says what it can run of the pool (see
// lua/gate_announce.lua).
var announceScript = redis.NewScript(announceLua)

// announce tells Redis how many of the pool's jobs this process can run at
// once (its concurrency) for the next GateLeaseTTL, or with running false
// that it runs the pool no more, so that status can say what the live
// workers can run between them (PoolSlots.Capacity). When the pool's size
// in effect is more than that, it logs it once per state: an operator's
// resize above what the workers can reach is said where the workers' logs
// are read. A failed call is left to the next one.
func (g *gate) announce(ctx context.Context, running bool) {
	capacity, seen := g.ks.GateProcsKeys(g.name)
	conf := g.conf.Load()
	ttl := int64(0)
	if running {
		ttl = GateLeaseTTL.Milliseconds()
	}
	v, err := announceScript.Run(ctx, g.rdb, []string{capacity, seen, g.ks.PoolSizeKey(g.name)},
		g.processID, conf.pool.cfg.concurrency(), ttl).Int64Slice()
	if err != nil || len(v) != 3 || !running || g.log == nil {
		return
	}
	size := v[0]
	if size < 1 {
		size = int64(conf.size)
	}
	state := [2]int64{}
	if size > v[2] {
		state = [2]int64{size, v[2]}
	}
	g.mu.Lock()
	changed := state != g.shortfall
	g.shortfall = state
	g.mu.Unlock()
	switch {
	case !changed:
	case state != [2]int64{}:
		g.log.Warn("pool: the size in effect is more than the live workers can run; it is reached only when more workers start (or resize it down)",
			"pool", g.name, "size", size, "workers", v[1], "workers_can_run", v[2])
	default:
		g.log.Info("pool: the live workers can run the size in effect again", "pool", g.name, "size", size, "workers", v[1], "workers_can_run", v[2])
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
// that have not expired by Redis's clock, by holder process (host:pid:id),
// read in one step so that the holders always add up to active.
func ClusterSlots(ctx context.Context, rc redis.UniversalClient, namespace, pool string) (active int, holders map[string]int, err error) {
	ks := rdb.KeyspaceFor(namespace, rc)
	leases, _ := ks.GateKeys(pool)
	capacity, seen := ks.GateProcsKeys(pool)
	cmd := poolStatsScript.Run(ctx, rc, []string{leases, leases + ":holders", ks.PoolSizeKey(pool), capacity, seen}, 0, "1")
	_, slots, err := parsePoolStats(cmd, 0)
	if err != nil {
		return 0, nil, err
	}
	holders = map[string]int{}
	for h, n := range slots.Holders {
		holders[h] = int(n)
	}
	return int(slots.InUse), holders, nil
}
