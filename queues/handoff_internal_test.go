package queues

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/priority"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// scriptGate is a go-redis hook that, while closed, holds every script
// call (EVALSHA, EVAL, FCALL) until it opens: what a job does meanwhile, it does
// without Redis.
type scriptGate struct {
	closed atomic.Bool
	open   chan struct{}
	held   atomic.Int64
}

func newScriptGate() *scriptGate { return &scriptGate{open: make(chan struct{})} }

func (h *scriptGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); h.closed.Load() && (name == "evalsha" || name == "eval" || name == "fcall") {
			h.held.Add(1)
			<-h.open
		}
		return next(ctx, cmd)
	}
}

func (h *scriptGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// acquireAsync asks for a slot for job in a goroutine; the member comes on
// the channel once the job may start (an error fails the test).
func acquireAsync(t *testing.T, g *gate, job, queue string) <-chan string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		m, err := g.acquire(context.Background(), job, queue)
		if err != nil {
			t.Errorf("acquire %s: %v", job, err)
			return
		}
		got <- m
	}()
	return got
}

// waitsInLine waits until job is a waiter in Redis and in g, and g's last
// reply let a slot freed here be handed on (handLocked) or, with
// handOff false, did not, and named other as the best other process's
// waiter's rank (0: none): the reply to the job's own question, not an
// earlier one.
func waitsInLine(t *testing.T, g *gate, rc redis.UniversalClient, member string, handOff bool, other int) {
	t.Helper()
	testwait.For(t, 10*time.Second, member+" to wait in line", func() bool {
		g.mu.Lock()
		ok := g.handOff.ok == handOff && g.handOff.otherRank == other
		g.mu.Unlock()
		return ok && inLine(g, rc, member)
	})
}

// inLine says whether member, a job of g waiting for a slot, waits in
// Redis's line itself or behind its process's stand-in (gate_standin.go),
// which does.
func inLine(g *gate, rc redis.UniversalClient, member string) bool {
	g.mu.Lock()
	w := g.waiters[member]
	var line []string
	if w != nil {
		line = []string{member}
		if w.behind != nil {
			line = nil
			for _, s := range g.waiters {
				if s.standIn && s.queue == w.queue {
					line = append(line, s.member)
				}
			}
		}
	}
	g.mu.Unlock()
	for _, m := range line {
		if rc.ZScore(context.Background(), g.keys().Waiting, m).Err() == nil {
			return true
		}
	}
	return false
}

func holder(t *testing.T, g *gate, rc redis.UniversalClient, member string) string {
	t.Helper()
	h, err := rc.HGet(context.Background(), g.keys().Holders, member).Result()
	if err == redis.Nil {
		return ""
	}
	require.NoError(t, err)
	return h
}

// holdCalls, with held, makes g send nothing to Redis from here, as far
// as it knows: a timer is due for the held releases and both calls are
// in flight. With held false, neither is.
func holdCalls(g *gate, held bool) {
	g.bmu.Lock()
	defer g.bmu.Unlock()
	if held {
		g.lazyDue, g.inFlight = true, gateMaxInFlight
	} else {
		g.lazyDue, g.inFlight = false, 0
	}
}

// heldRelease has job "a" of queue take a slot of g and end once g sends
// nothing more to Redis (holdCalls): its release is held back
// (releaseLater), for a job of the process to take over. It returns a's
// member, whose lease Redis still holds.
func heldRelease(t *testing.T, g *gate, queue string) string {
	t.Helper()
	ctx := context.Background()
	a, err := g.acquire(ctx, "a", queue)
	require.NoError(t, err)
	holdCalls(g, true)
	g.release(ctx, a)
	return a
}

// callsGoAgain lets g's calls go again (holdCalls) and sends what is
// queued.
func callsGoAgain(g *gate) {
	holdCalls(g, false)
	g.flush(false)
}

// TestHandOffStartsTheNextJobWithoutRedis: in a full pool, a job that ends
// hands its slot to the job waiting in its own process, which starts
// without waiting for Redis; Redis then holds the slot as that job's, and
// the count never moved.
func TestHandOffStartsTheNextJobWithoutRedis(t *testing.T) {
	t.Parallel()
	g, r, cfg := plainGate(t, 1)
	ctx := context.Background()
	q := QueueName(cfg.Namespace, "p", "")
	a, err := g.acquire(ctx, "a", q)
	require.NoError(t, err)
	next := acquireAsync(t, g, "b", q)
	waitsInLine(t, g, r.Client, "b@"+q, true, 0)

	hold := newScriptGate()
	r.Client.AddHook(hold)
	hold.closed.Store(true)
	released := make(chan struct{})
	go func() {
		g.release(ctx, a)
		close(released)
	}()
	select {
	case m := <-next:
		require.Equal(t, "b@"+q, m)
	case <-time.After(10 * time.Second):
		t.Fatal("b did not start while Redis was held")
	}
	// The op that tells Redis is the call the hook holds: b started
	// without it.
	testwait.For(t, 10*time.Second, "the hand-off's call to reach Redis", func() bool { return hold.held.Load() > 0 })
	hold.closed.Store(false)
	close(hold.open)
	<-released
	g.sendOps()
	require.Equal(t, []string{"b@" + q}, r.Client.ZRange(ctx, g.keys().Leases, 0, -1).Val(), "the slot is b's")
	require.Equal(t, g.processID, holder(t, g, r.Client, "b@"+q))
	// b waited behind a stand-in, which leaves the line once nobody waits
	// behind it.
	testwait.For(t, 10*time.Second, "nobody to wait in line", func() bool { return r.Client.ZCard(ctx, g.keys().Waiting).Val() == 0 })

	g.release(ctx, "b@"+q)
	g.sendOps()
	require.Zero(t, r.Client.ZCard(ctx, g.keys().Leases).Val())
}

// tieredGates returns two gates (two processes) of one cluster-scoped
// strict pool "p" of size 1 with tiers high and low.
func tieredGates(t *testing.T) (g1, g2 *gate, r *testredis.Redis, high, low string) {
	t.Helper()
	return tieredGatesSized(t, 1)
}

// tieredGatesSized is tieredGates for a pool of size.
func tieredGatesSized(t *testing.T, size int) (g1, g2 *gate, r *testredis.Redis, high, low string) {
	t.Helper()
	r = testredis.New(t)
	tiers, err := priority.New(priority.Config{Tiers: []string{"high", "low"}, Default: "low"})
	require.NoError(t, err)
	cfg := Config{Namespace: r.Namespace(t), Tiers: tiers, Pools: []PoolConfig{{Name: "p", Size: size, JobTypes: []string{"x"}, Tiers: []string{"high", "low"}}}}.WithDefaults()
	reg, err := newRegistry(cfg, rdb.NewKeyspace(cfg.Namespace, false), nil)
	require.NoError(t, err)
	g1 = newGate(r.Client, rdb.NewKeyspace(cfg.Namespace, false), reg.pools[0], newProcessID(), time.Now)
	g2 = newGate(r.Client, rdb.NewKeyspace(cfg.Namespace, false), reg.pools[0], newProcessID(), time.Now)
	return g1, g2, r, QueueName(cfg.Namespace, "p", "high"), QueueName(cfg.Namespace, "p", "low")
}

// TestHandOffKeepsTierOrderAcrossProcesses: a slot freed in one process
// goes to a higher tier's job waiting in another, not to a lower tier's
// job waiting in its own.
func TestHandOffKeepsTierOrderAcrossProcesses(t *testing.T) {
	t.Parallel()
	g1, g2, r, high, low := tieredGates(t)
	ctx := context.Background()
	a, err := g1.acquire(ctx, "a", low)
	require.NoError(t, err)
	h := acquireAsync(t, g2, "h", high)
	waitsInLine(t, g2, r.Client, "h@"+high, true, 0)
	l := acquireAsync(t, g1, "l", low)
	waitsInLine(t, g1, r.Client, "l@"+low, true, 1)

	g1.release(ctx, a)
	select {
	case <-h: // handed to it through Redis; it asks again at the latest gateRetryEvery later
	case <-time.After(10 * time.Second):
		t.Fatal("the high tier's job did not get the slot")
	}
	require.Equal(t, g2.processID, holder(t, g1, r.Client, "h@"+high))
	select {
	case <-l:
		t.Fatal("the low tier's job started ahead of the high tier's")
	default:
	}
	g2.release(ctx, "h@"+high)
	g2.sendOps()
	<-l
	g1.release(ctx, "l@"+low)
	g1.sendOps()
}

// TestHandOffNeverGoesDownATier: a job that ends hands its slot in its own
// process only to a job of its tier or a higher one. A higher tier's job
// another process took from its queue and has not asked for a slot yet
// (waiting behind its stand-in between two questions, or on its way) is
// in no reply; only Redis sees it, so the slot goes through Redis, which
// keeps it for that job.
func TestHandOffNeverGoesDownATier(t *testing.T) {
	t.Parallel()
	g1, g2, r, high, low := tieredGates(t)
	ctx := context.Background()
	a, err := g1.acquire(ctx, "a", high)
	require.NoError(t, err)
	l := acquireAsync(t, g1, "l", low)
	waitsInLine(t, g1, r.Client, "l@"+low, true, 0)
	// h: taken from the high queue by the other process, not asked yet.
	require.NoError(t, r.Client.LPush(ctx, rdb.ActiveKey(high), "h").Err())
	require.NoError(t, r.Client.ZAdd(ctx, rdb.LeaseKey(high), redisZ(float64(time.Now().Add(30*time.Second).Unix()), "h")).Err())

	g1.release(ctx, a)
	g1.sendOps()
	g1.mu.Lock()
	_, waiting := g1.waiters["l@"+low]
	g1.mu.Unlock()
	require.True(t, waiting, "a low tier's job got a high tier's slot in its process while a high tier's job was dequeued elsewhere")
	require.Zero(t, r.Client.ZCard(ctx, g1.keys().Leases).Val(), "the slot is free, kept for the high tier's job")
	h, err := g2.acquire(ctx, "h", high)
	require.NoError(t, err, "the high tier's job takes the slot")
	require.NoError(t, r.Client.LRem(ctx, rdb.ActiveKey(high), 0, "h").Err())
	g2.release(ctx, h)
	g2.sendOps()
	m := recvSlot(t, l, "the low tier's job to get the slot once the high tier's job ended")
	g1.release(ctx, m)
	g1.sendOps()
	drained(t, g1, r.Client)
}

// TestHandOffKeepsFirstComeFirstServedWithinSlack: within a tier, a slot
// freed in one process goes to its own waiting job unless a job in
// another process has waited longer by more than the slack
// (gateHandOffSlack): with no slack, to the one that waited longest; with
// a slack longer than any wait here, to the job in the same process.
func TestHandOffKeepsFirstComeFirstServedWithinSlack(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		slack time.Duration
		local bool
	}{{"no slack", 0, false}, {"an hour of slack", time.Hour, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g1, g2, r, high, _ := tieredGates(t)
			g1.handOffSlack = tc.slack
			ctx := context.Background()
			a, err := g1.acquire(ctx, "a", high)
			require.NoError(t, err)
			o := acquireAsync(t, g2, "o", high)
			waitsInLine(t, g2, r.Client, "o@"+high, true, 0)
			// Redis's clock (its waiters' scores) moves on by a few ms, so
			// the job asking next has surely waited less.
			t0 := r.Client.Time(ctx).Val()
			testwait.For(t, 10*time.Second, "Redis's clock to move on", func() bool {
				return r.Client.Time(ctx).Val().Sub(t0) > 3*time.Millisecond
			})
			y := acquireAsync(t, g1, "y", high)
			waitsInLine(t, g1, r.Client, "y@"+high, true, 1)

			g1.release(ctx, a)
			first, firstGate, then, thenGate := o, g2, y, g1
			if tc.local {
				first, firstGate, then, thenGate = y, g1, o, g2
			}
			var m string
			select {
			case m = <-first:
			case <-time.After(10 * time.Second):
				t.Fatal("the slot went to neither, or to the wrong one")
			}
			firstGate.sendOps() // a hand-on to a job that waited behind a stand-in may go with a later call
			require.Equal(t, firstGate.processID, holder(t, g1, r.Client, m))
			select {
			case <-then:
				t.Fatal("both started in a pool of 1")
			default:
			}
			firstGate.release(ctx, m)
			firstGate.sendOps()
			m = <-then
			thenGate.release(ctx, m)
			thenGate.sendOps()
		})
	}
}

// TestHandOffStopsOnceAShrinkIsSeen: once a process has seen that an
// operator made the pool smaller than the slots in use, a job that ends
// frees its slot instead of handing it on, so the running jobs fall to the
// new size.
func TestHandOffStopsOnceAShrinkIsSeen(t *testing.T) {
	t.Parallel()
	g, r, cfg := plainGate(t, 2)
	ctx := context.Background()
	q := QueueName(cfg.Namespace, "p", "")
	a, err := g.acquire(ctx, "a", q)
	require.NoError(t, err)
	b, err := g.acquire(ctx, "b", q)
	require.NoError(t, err)
	w := acquireAsync(t, g, "w", q)
	waitsInLine(t, g, r.Client, "w@"+q, true, 0)

	require.NoError(t, r.Client.Set(ctx, g.keys().Size, 1, 0).Err())
	// The waiting job asks again every gateRetryEvery: its reply shows 2
	// slots in use of 1.
	waitsInLine(t, g, r.Client, "w@"+q, false, 0)
	g.release(ctx, a)
	g.sendOps()
	require.Equal(t, []string{b}, r.Client.ZRange(ctx, g.keys().Leases, 0, -1).Val(), "a's slot was freed, not handed on")
	select {
	case <-w:
		t.Fatal("a job started in a pool shrunk to 1 while another ran")
	default:
	}
	g.release(ctx, b)
	m := <-w
	g.release(ctx, m)
	g.sendOps()
}

// TestHandOffsLeaveNoSlotBehind: many short jobs in three processes, with
// the pool full and with room by turns, taking slots handed on within a
// process (from jobs that ended, held releases, waiting jobs) and through
// Redis: when all are done, no slot and no place in line is left held, so
// no slot is lost to a lease without a job.
func TestHandOffsLeaveNoSlotBehind(t *testing.T) {
	t.Parallel()
	g1, r, cfg := plainGate(t, 3)
	gates := []*gate{g1}
	for range 2 {
		gates = append(gates, newGate(r.Client, rdb.NewKeyspace(cfg.Namespace, false), g1.conf.Load().pool, newProcessID(), time.Now))
	}
	ctx := context.Background()
	// Each process relays the slots handed to its jobs by the others.
	runCtx, stopRun := context.WithCancel(ctx)
	var runs sync.WaitGroup
	for _, g := range gates {
		runs.Go(func() { g.run(runCtx) })
	}
	q := QueueName(cfg.Namespace, "p", "")
	var running, most atomic.Int64
	var jobs sync.WaitGroup
	for p, g := range gates {
		for w := range 4 {
			jobs.Go(func() {
				for i := range 150 {
					m, err := g.acquire(ctx, fmt.Sprintf("job-%d-%d-%d", p, w, i), q)
					if err != nil {
						t.Errorf("acquire: %v", err)
						return
					}
					n := running.Add(1)
					for {
						if old := most.Load(); n <= old || most.CompareAndSwap(old, n) {
							break
						}
					}
					if i%3 == 0 {
						time.Sleep(time.Millisecond) // some jobs take a moment, so the pool fills
					}
					running.Add(-1)
					g.release(ctx, m)
				}
			})
		}
	}
	jobs.Wait()
	stopRun()
	runs.Wait() // each sends what it held back as it ends
	require.LessOrEqual(t, most.Load(), int64(3), "more jobs ran at once than the pool's size")
	require.Zero(t, r.Client.ZCard(ctx, g1.keys().Leases).Val(), "a slot is left held with no job behind it")
	require.Zero(t, r.Client.ZCard(ctx, g1.keys().Waiting).Val(), "a place in line is left behind")
}

// TestHeldReleaseGoesToTheNextJob: a job that ends while the pool has room
// holds its release back for a moment (releaseLater); a job of the same
// process that asks meanwhile takes that slot with no call to Redis, and
// the held release, when it goes, writes the slot as that job's.
func TestHeldReleaseGoesToTheNextJob(t *testing.T) {
	t.Parallel()
	g, r, cfg := plainGate(t, 2)
	ctx := context.Background()
	q := QueueName(cfg.Namespace, "p", "")
	// Nothing goes to Redis once a ends: a timer is due for the held
	// releases and both calls are in flight, as far as the gate knows.
	a := heldRelease(t, g, q)
	var b string
	select {
	case b = <-acquireAsync(t, g, "b", q):
	case <-time.After(10 * time.Second):
		t.Fatal("b did not take a's slot without Redis")
	}
	require.Equal(t, []string{a}, r.Client.ZRange(ctx, g.keys().Leases, 0, -1).Val(), "Redis has heard nothing yet")

	callsGoAgain(g)
	require.Equal(t, []string{b}, r.Client.ZRange(ctx, g.keys().Leases, 0, -1).Val(), "the held release wrote the slot as b's")
	require.Equal(t, g.processID, holder(t, g, r.Client, b))
	g.release(ctx, b)
	g.sendOps()
	require.Zero(t, r.Client.ZCard(ctx, g.keys().Leases).Val())
}

// TestAbandonedSlotIsNeverTakenOver: a process whose run of a job was
// taken over by another process (fenced) lets go of that job's slot
// without holding the release back for its next job, even though its last
// reply said the pool had room: the slot is the other process's now, and
// a job that took it over would run beside that copy, one more than the
// size.
func TestAbandonedSlotIsNeverTakenOver(t *testing.T) {
	t.Parallel()
	g1, r, cfg := plainGate(t, 1)
	g2 := newGate(r.Client, rdb.NewKeyspace(cfg.Namespace, false), g1.conf.Load().pool, newProcessID(), time.Now)
	ctx := context.Background()
	q := QueueName(cfg.Namespace, "p", "")
	x, err := g1.acquire(ctx, "x", q)
	require.NoError(t, err)
	g1.release(ctx, x)
	g1.sendOps()
	g1.mu.Lock()
	require.True(t, g1.handOff.room, "g1's last reply: room, nobody waiting")
	g1.mu.Unlock()

	// The job's new run, in g2, holds the only slot under the same member.
	d, err := g2.acquire(ctx, "d", q)
	require.NoError(t, err)
	g1.abandon(ctx, d)
	b := acquireAsync(t, g1, "b", q)
	testwait.For(t, 10*time.Second, "b to wait in line, or start", func() bool {
		if len(b) > 0 {
			return true
		}
		return inLine(g1, r.Client, "b@"+q)
	})
	require.Empty(t, b, "b started while d's new run held the only slot")
	require.Equal(t, []string{d}, r.Client.ZRange(ctx, g1.keys().Leases, 0, -1).Val())
	require.Equal(t, g2.processID, holder(t, g1, r.Client, d), "the abandoned release left the other run's slot alone")

	g2.release(ctx, d)
	g2.sendOps()
	var m string
	select {
	case m = <-b:
	case <-time.After(10 * time.Second):
		t.Fatal("b did not get the slot once d's new run ended")
	}
	g1.release(ctx, m)
	g1.sendOps()
	require.Zero(t, r.Client.ZCard(ctx, g1.keys().Leases).Val())
}

// TestHeldReleaseGoesOnceItsTimerFired: a release held back while a timer
// was already due goes with the first call after that timer fired, even
// when the timer found two calls in flight and a release held after it
// armed the next timer: it is not held for a second hold.
func TestHeldReleaseGoesOnceItsTimerFired(t *testing.T) {
	t.Parallel()
	g, r, cfg := plainGate(t, 5)
	ctx := context.Background()
	q := QueueName(cfg.Namespace, "p", "")
	a, err := g.acquire(ctx, "a", q)
	require.NoError(t, err)
	b, err := g.acquire(ctx, "b", q)
	require.NoError(t, err)
	// A timer armed for an earlier release is due, and two calls are in
	// flight, when a ends.
	holdCalls(g, true)
	g.release(ctx, a)
	g.heldReleasesDue() // that timer fires: its flush finds the calls in flight
	g.release(ctx, b)   // held too: it arms the next timer
	g.bmu.Lock()
	require.Len(t, g.queue, 2, "both held back")
	g.inFlight = 0
	g.bmu.Unlock()
	g.flush(false) // the first call in flight to end
	require.ErrorIs(t, r.Client.ZScore(ctx, g.keys().Leases, a).Err(), redis.Nil, "a's release went with the first call after its timer")
	g.sendOps()
	require.Zero(t, r.Client.ZCard(ctx, g.keys().Leases).Val())
}

// TestTakeOverNeedsARecentReply: a job takes a held release over only
// while its process's last reply is recent (gateTakeOverReplyAge); after a
// quiet spell, the room that reply saw says nothing of now, and the job
// asks Redis.
func TestTakeOverNeedsARecentReply(t *testing.T) {
	t.Parallel()
	g, r, cfg := plainGate(t, 2)
	q := QueueName(cfg.Namespace, "p", "")
	heldRelease(t, g, q)
	g.mu.Lock()
	require.True(t, g.handOff.room)
	g.handOff.at = time.Now().Add(-time.Second)
	g.mu.Unlock()
	require.False(t, g.takeHeldRelease("b@"+q, 1), "a take-over went by a reply a second old")
	g.mu.Lock()
	g.handOff.at = time.Now()
	g.mu.Unlock()
	require.True(t, g.takeHeldRelease("b@"+q, 1), "a take-over refused on a fresh reply")

	heldReleaseWentTo(t, g, r.Client, "b@"+q)
}

// TestTakeOverNeverGoesAheadOfAWaitingJob: while a job of a higher tier
// waits for a slot in this process (its question may be on its way to
// Redis, so the last reply can show room and nobody waiting), a job taken
// next does not take a held slot over ahead of it: it asks Redis, which
// puts it behind. A job of the same tier may.
func TestTakeOverNeverGoesAheadOfAWaitingJob(t *testing.T) {
	t.Parallel()
	g, _, r, high, low := tieredGatesSized(t, 2)
	// The job that ends is of the low tier: a low tier's job may take its
	// slot over (a higher tier's slot goes through Redis:
	// TestHandOffNeverGoesDownATier).
	heldRelease(t, g, low)
	// h, a job of the high tier, waits in this process; its question is
	// still on its way.
	g.mu.Lock()
	require.True(t, g.handOff.room, "the last reply: room, nobody waiting")
	g.waiters["h@"+high] = &localWaiter{member: "h@" + high, ch: make(chan struct{}, 1), rank: 1, since: time.Now()}
	g.mu.Unlock()
	require.False(t, g.takeHeldRelease("l@"+low, 2), "a low tier's job took a slot over while a high tier's job of its process waited")
	require.True(t, g.takeHeldRelease("b@"+high, 1), "a job of the waiting job's own tier could not take the slot over")

	g.mu.Lock()
	delete(g.waiters, "h@"+high)
	g.mu.Unlock()
	heldReleaseWentTo(t, g, r.Client, "b@"+high)
}

// TestTakeOverNeverGoesDownATier: the held release of a job that ended
// while the pool had room is taken over only by a job of its tier or a
// higher one (TestHandOffNeverGoesDownATier says why).
func TestTakeOverNeverGoesDownATier(t *testing.T) {
	t.Parallel()
	g, _, r, high, low := tieredGatesSized(t, 2)
	heldRelease(t, g, high)
	g.mu.Lock()
	require.True(t, g.handOff.room, "the last reply: room, nobody waiting")
	g.mu.Unlock()
	require.False(t, g.takeHeldRelease("l@"+low, 2), "a low tier's job took a high tier's held slot over")
	require.True(t, g.takeHeldRelease("b@"+high, 1), "a job of the ended job's tier could not take its slot over")

	heldReleaseWentTo(t, g, r.Client, "b@"+high)
}

// TestTakeOverChainNeverGoesDownATier: a held slot a higher tier's job took
// over and left again is that job's slot now: a lower tier's job does not
// take it over (it goes through Redis).
func TestTakeOverChainNeverGoesDownATier(t *testing.T) {
	t.Parallel()
	g, _, r, high, low := tieredGatesSized(t, 2)
	heldRelease(t, g, low)
	require.True(t, g.takeHeldRelease("h@"+high, 1), "a high tier's job takes a low tier's held slot over")
	g.release(context.Background(), "h@"+high) // ends at once: the slot is held back again
	require.False(t, g.takeHeldRelease("l@"+low, 2), "a low tier's job took over the slot a high tier's job had just left")
	callsGoAgain(g)
	drained(t, g, r.Client)
}

// TestSlotsStayForAHigherTiersPendingJobs: while a higher tier's jobs are
// pending and need the free slots (the rule Redis keeps when a job asks),
// no slot goes to a lower tier's job within a process either: neither a
// held release taken over in a pool with room, nor a hand-off in a full
// pool. The last reply says so (rdb's bestOther).
func TestSlotsStayForAHigherTiersPendingJobs(t *testing.T) {
	t.Parallel()
	t.Run("take-over", func(t *testing.T) {
		t.Parallel()
		g, _, r, high, low := tieredGatesSized(t, 2)
		ctx := context.Background()
		require.NoError(t, r.Client.LPush(ctx, rdb.PendingKey(high), "h1").Err())
		heldRelease(t, g, low) // two free slots, one job pending above: room for both
		require.False(t, g.takeHeldRelease("b@"+low, 2), "a low tier's job took over the slot the pending high job needs")
		callsGoAgain(g)
		drained(t, g, r.Client)
	})
	t.Run("hand-off", func(t *testing.T) {
		t.Parallel()
		g, _, r, high, low := tieredGatesSized(t, 1)
		ctx := context.Background()
		a, err := g.acquire(ctx, "a", low)
		require.NoError(t, err)
		l := acquireAsync(t, g, "l", low)
		waitsInLine(t, g, r.Client, "l@"+low, true, 0)
		require.NoError(t, r.Client.LPush(ctx, rdb.PendingKey(high), "h1").Err())
		// The stand-in asks again every gateRetryEvery: a reply to a call
		// made since the push counts the pending job as a high waiter.
		testwait.For(t, 10*time.Second, "a reply that sees the pending high job", func() bool {
			g.mu.Lock()
			defer g.mu.Unlock()
			return g.handOff.ok && g.handOff.otherRank == 1
		})
		g.mu.Lock()
		next := g.mayHandOnLocked(2) // a's tier: low
		g.mu.Unlock()
		require.Nil(t, next, "a low tier's job would be handed the slot the pending high job needs")
		require.NoError(t, r.Client.Del(ctx, rdb.PendingKey(high)).Err())
		g.release(ctx, a)
		m := recvSlot(t, l, "the low tier's job to get the slot")
		g.release(ctx, m)
		g.sendOps()
		drained(t, g, r.Client)
	})
}

// heldReleaseWentTo lets g's calls go again (holdCalls) and checks that
// the held release a job took over wrote the slot as member's, the one
// lease in Redis; then member ends and the pool is empty.
func heldReleaseWentTo(t *testing.T, g *gate, rc redis.UniversalClient, member string) {
	t.Helper()
	ctx := context.Background()
	callsGoAgain(g)
	require.Equal(t, []string{member}, rc.ZRange(ctx, g.keys().Leases, 0, -1).Val())
	g.release(ctx, member)
	g.sendOps()
	require.Zero(t, rc.ZCard(ctx, g.keys().Leases).Val())
}
