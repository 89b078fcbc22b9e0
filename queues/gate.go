package queues

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
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
)

// errGateWait marks a job that gave up waiting for a cluster-wide slot
// (its deadline came near, or the client is stopping). It is not a failure
// of the job: it goes back to its queue without using up a retry.
var errGateWait = errors.New("gave up waiting for a cluster-wide slot")

// errHandedBack marks a job whose worker its process gave to a job taken
// back from a worker process that stopped answering (rdb's
// lua/gate_lib.lua, handBack): the gate put it back in its queue, behind
// that job, its place in the waiting line kept. It never ran; asynq must
// write nothing for it (the runner refuses the write: fences.handBack).
var errHandedBack = fmt.Errorf("%w: its worker was given to a job taken back from a worker process that stopped answering; back in its queue", errGateWait)

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
// rdb's lua/gate_lib.lua, settle). The gate only ever lifts a pause it set
// itself (the key holds rdb.GatePause); an operator's pause stays.
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
	rdb       redis.UniversalClient
	name      string // the pool's
	ks        rdb.Keyspace
	processID string
	now       func() time.Time // local durations only (stats)
	conf      atomic.Pointer[gateConf]

	// renewMu orders renewals against releases: a renewal's view of the
	// held slots and its script run as one step, so it never re-adds a slot
	// a release has just freed.
	renewMu sync.RWMutex

	mu   sync.Mutex
	held map[string]bool
	// asked holds the members of held that asked Redis for a slot
	// themselves and were then handed one here (takeWaiterLocked): their
	// place in line may outlive a hand-on whose call failed, so their
	// release must look for it (rdb.Free.Ran). A slot Redis gave took its
	// member out of the line already.
	asked    map[string]bool
	waiters  map[string]*localWaiter // jobs of this process waiting for a slot (acquire)
	wake     chan struct{}           // closed when a slot may have freed somewhere
	stopping chan struct{}           // closed when the client stops: waiters give up
	stopOnce sync.Once
	// handOff is what the last step reply said about handing a slot from
	// a job that ends to a job waiting in this process (handLocked).
	handOff handOffView
	// handOffSlack is gateHandOffSlack (tests change it).
	handOffSlack time.Duration
	// handing holds the hand-offs Redis has not heard of yet (sent and
	// answered), by the member handed to: set when the waiter is picked
	// (handLocked), so that the job's own release, however soon it
	// comes, waits for it (awaitHandOff).
	handing map[string]*gateOp
	// standIns are the stand-ins of this process's jobs waiting for a
	// slot, by queue (gate_standin.go); standInSeq numbers their members.
	standIns   map[string]*standIn
	standInSeq uint64
	// bmu guards the ops waiting to go to Redis together (submit).
	bmu      sync.Mutex
	queue    []*gateOp
	inFlight int
	full     bool   // the pool was full at the last step's reply
	lazyDue  bool   // a timer will send the releases held back (releaseLater)
	quietDue bool   // a timer will send the quiet hand-ons (gateHoldHandOn)
	calls    uint64 // step calls made; each reply is applied only over an older one's
	fullAt   uint64 // the call whose reply set full

	recovering bool      // a call to Redis failed: re-add held slots first
	failures   uint64    // calls to Redis that failed (failed): a reply to a call made before one says nothing of now
	lastOK     time.Time // the last call to Redis that succeeded (monotonic)
	serverID   string    // the run_id of the Redis node holding the pool's keys, "" when unknown
	// identify reads that run_id (rdb's SlotGate.ServerID; tests replace
	// it).
	identify   func(ctx context.Context) (string, error)
	waits      int64 // jobs that waited for a slot after being dequeued
	waitsTotal time.Duration

	// log, when set, hears when the pool's size in effect is more than the
	// live worker processes can run between them (announce).
	log *slog.Logger
	// shortfall is the last such state logged: size and capacity, or
	// zeros when there was none.
	shortfall [2]int
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
	g := &gate{
		rdb: rc, name: p.Name(), ks: ks,
		processID: processID, held: map[string]bool{}, asked: map[string]bool{}, waiters: map[string]*localWaiter{}, handing: map[string]*gateOp{}, standIns: map[string]*standIn{}, wake: make(chan struct{}), now: now,
		stopping: make(chan struct{}), lastOK: time.Now(), handOffSlack: gateHandOffSlack,
	}
	g.identify = func(ctx context.Context) (string, error) { return g.conf.Load().slots.ServerID(ctx) }
	g.configure(p)
	return g
}

// gateConf is what the gate takes from the pool's config. A
// reconfiguration swaps it whole (gate.configure); each call to Redis
// reads one.
type gateConf struct {
	pool   *Pool
	size   int  // the configured size; an operator's resize in Redis wins (see rdb's lua/gate_lib.lua)
	strict bool // strict tiers: waiters are ranked by tier
	// slots is the pool's gate in Redis for this config: its scripts'
	// keys and fixed arguments, encoded once.
	slots *rdb.SlotGate
	// holdRelease: a release may wait for another call to carry it
	// (releaseLater). Not with steering or a start rate: their rules need
	// a freed slot seen at once, as their pause when full does.
	holdRelease bool
}

// rank is the place of queue's jobs among this process's waiters: its
// tier's rank with strict tiers (1 = highest), else 1 for every queue.
func (c *gateConf) rank(queue string) int {
	if !c.strict {
		return 1
	}
	return c.pool.rank(queue)
}

// memberRank is rank for the queue of member (<id>@<queue>).
func (c *gateConf) memberRank(member string) int {
	m, _ := rdb.ParseMember(member)
	return c.rank(m.Queue)
}

// configure derives every setting the gate takes from the pool's config,
// so that a reconfigured pool (Client.Reconfigure) is gated by its new
// settings from the next call on. Slots held stay held: their members
// name the job and its queue, not the settings.
func (g *gate) configure(p *Pool) {
	c := &gateConf{pool: p, size: p.Size(), strict: p.cfg.QueueOrder == QueueOrderStrict}
	sc := rdb.SlotGateConfig{
		Pool: p.Name(), Queues: p.Queues(), Size: c.size, Strict: c.strict, Steering: p.steering(),
		Process: g.processID, LeaseTTL: GateLeaseTTL, Capacity: p.cfg.concurrency(),
	}
	if r := p.cfg.StartRate; r != nil {
		sc.StartInterval, sc.StartBurst = r.interval(), r.Burst
	}
	c.slots = rdb.NewSlotGate(g.rdb, g.ks, sc)
	c.holdRelease = !p.cfg.pausesWhenFull()
	g.conf.Store(c)
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
