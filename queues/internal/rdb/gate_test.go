package rdb

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testwait"
)

// The cluster-wide gate's scripts: each case builds the gate of a pool
// "p" of three tiers (or of none) in the case's namespace, as a process
// would, and checks both the typed reply and what the script left in
// Redis.

const testLeaseTTL = 15 * time.Second

// testGate returns the gate of pool "p" of size, with tiers high, mid and
// low (queues highest first), for process; change adjusts the config.
func testGate(b backend, process string, size int, change func(*SlotGateConfig)) *SlotGate {
	c := SlotGateConfig{
		Pool: "p", Size: size, Process: process, LeaseTTL: testLeaseTTL, Capacity: 4,
		Queues: []string{b.KS.Queue("p", "high"), b.KS.Queue("p", "mid"), b.KS.Queue("p", "low")},
	}
	if change != nil {
		change(&c)
	}
	return NewSlotGate(b.RC, b.KS, c)
}

// member is job id's member in the queue of tier.
func member(b backend, id, tier string) string {
	return Member{ID: id, Queue: b.KS.Queue("p", tier)}.String()
}

func ask(b backend, id, tier string, rank int) Ask {
	return Ask{Member: member(b, id, tier), Rank: rank}
}

// leases returns the members holding a slot, and by which process.
func leases(t *testing.T, b backend, g *SlotGate) map[string]string {
	t.Helper()
	ctx := context.Background()
	ms, err := b.RC.ZRange(ctx, g.Keys().Leases, 0, -1).Result()
	require.NoError(t, err)
	holders, err := b.RC.HGetAll(ctx, g.Keys().Holders).Result()
	require.NoError(t, err)
	out := map[string]string{}
	for _, m := range ms {
		out[m] = holders[m]
	}
	require.Len(t, holders, len(out), "a holder without a lease: %v", holders)
	return out
}

// waiters returns the members waiting for a slot, best first, and by which
// process.
func waiters(t *testing.T, b backend, g *SlotGate) ([]string, map[string]string) {
	t.Helper()
	ctx := context.Background()
	ws, err := b.RC.ZRange(ctx, g.Keys().Waiting, 0, -1).Result()
	require.NoError(t, err)
	procs, err := b.RC.HGetAll(ctx, g.Keys().WaitProcs).Result()
	require.NoError(t, err)
	exp, err := b.RC.ZCard(ctx, g.Keys().WaitExpiry).Result()
	require.NoError(t, err)
	require.EqualValues(t, len(ws), exp, "every waiter has an expiry")
	require.Len(t, procs, len(ws), "every waiter has a process")
	return ws, procs
}

func step(t *testing.T, g *SlotGate, a StepArgs) StepReply {
	t.Helper()
	r, err := g.Step(context.Background(), a)
	require.NoError(t, err)
	return r
}

// dequeue moves the oldest pending job of tier to its active list with a
// fresh asynq lease, as asynq's dequeue does: job id, then, has been
// taken from its queue and has not asked for a slot yet.
func dequeue(t *testing.T, b backend, id, tier string) {
	t.Helper()
	ctx := context.Background()
	q := b.KS.Queue("p", tier)
	require.Equal(t, id, b.RC.LMove(ctx, PendingKey(q), ActiveKey(q), "RIGHT", "LEFT").Val())
	require.NoError(t, b.RC.ZAdd(ctx, LeaseKey(q), redisZ(float64(time.Now().Add(30*time.Second).Unix()), id)).Err())
}

func pausedValue(t *testing.T, b backend, tier string) string {
	t.Helper()
	v, err := b.RC.Get(context.Background(), PausedKey(b.KS.Queue("p", tier))).Result()
	if err == redis.Nil {
		return ""
	}
	require.NoError(t, err)
	return v
}

// subscribe subscribes process's gate to the freed channel and returns
// the messages it reads, once the subscription is in place.
func subscribe(t *testing.T, g *SlotGate) <-chan Freed {
	t.Helper()
	ctx := context.Background()
	sub := g.SubscribeFreed(ctx)
	for range 2 { // the confirmations: the pool's channel and the process's
		_, err := sub.ps.Receive(ctx)
		require.NoError(t, err)
	}
	ch := make(chan Freed, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sub.Each(func(f Freed) { ch <- f })
	}()
	t.Cleanup(func() {
		_ = sub.Close()
		<-done
	})
	return ch
}

func nextFreed(t *testing.T, ch <-chan Freed) Freed {
	t.Helper()
	select {
	case f := <-ch:
		return f
	case <-time.After(10 * time.Second):
		t.Fatal("no message on the freed channel in 10 s")
		return Freed{}
	}
}

func init() {
	scriptCases = append(scriptCases,
		scriptCase{script: "gate_step", name: "jobs take the free slots, then wait", run: func(t *testing.T, b backend) {
			g := testGate(b, "P1", 2, nil)
			r := step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1), ask(b, "b", "mid", 2), ask(b, "c", "low", 3)}})
			require.Equal(t, 2, r.Count)
			require.Equal(t, 2, r.Size)
			require.Equal(t, []AskReply{{Taken: true}, {Taken: true}, {Taken: false}}, r.Asks)
			require.Empty(t, r.Granted)
			require.Equal(t, map[string]string{member(b, "a", "high"): "P1", member(b, "b", "mid"): "P1"}, leases(t, b, g))
			ws, procs := waiters(t, b, g)
			require.Equal(t, []string{member(b, "c", "low")}, ws)
			require.Equal(t, "P1", procs[member(b, "c", "low")])
			score, err := b.RC.ZScore(context.Background(), g.Keys().Leases, member(b, "a", "high")).Result()
			require.NoError(t, err)
			require.InDelta(t, float64(time.Now().Add(testLeaseTTL).UnixMilli()), score, 5000, "a lease lasts the TTL, by Redis's clock in ms")
		}},
		scriptCase{script: "gate_step", name: "a job that holds its slot keeps it when it asks again", run: func(t *testing.T, b backend) {
			g := testGate(b, "P1", 1, nil)
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}}).Asks[0].Taken)
			r := step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}})
			require.Equal(t, []AskReply{{Taken: true}}, r.Asks, "its lost reply must not make it wait behind its own lease")
			require.Equal(t, 1, r.Count)
			// Another process's copy of the same job asks as any other job.
			other := testGate(b, "P2", 1, nil)
			require.False(t, step(t, other, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}}).Asks[0].Taken)
		}},
		scriptCase{script: "gate_step", name: "strict tiers pause the queues below the highest with pending jobs", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 3, func(c *SlotGateConfig) { c.Strict = true })
			require.NoError(t, b.RC.LPush(ctx, PendingKey(b.KS.Queue("p", "mid")), "m1").Err())
			require.NoError(t, b.RC.LPush(ctx, PendingKey(b.KS.Queue("p", "low")), "l1").Err())
			require.NoError(t, b.RC.Set(ctx, PausedKey(b.KS.Queue("p", "high")), "1700000000", 0).Err()) // an operator's
			r := step(t, g, StepArgs{})
			require.Equal(t, 0, r.Count)
			require.Equal(t, "1700000000", pausedValue(t, b, "high"), "an operator's pause stays")
			require.Equal(t, "", pausedValue(t, b, "mid"), "open: the highest tier with pending jobs")
			require.Equal(t, GatePause, pausedValue(t, b, "low"))

			require.NoError(t, b.RC.Del(ctx, PendingKey(b.KS.Queue("p", "mid"))).Err())
			step(t, g, StepArgs{})
			require.Equal(t, "", pausedValue(t, b, "low"), "the gate lifts its own pause once mid ran dry")
		}},
		scriptCase{script: "gate_step", name: "a lower tier's job leaves the free slots a higher tier's pending jobs need, for a while", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 2, func(c *SlotGateConfig) { c.Strict = true })
			// A dequeue loop found high empty, then low not: "l1" and "l2"
			// were taken while "h1" was being enqueued.
			require.NoError(t, b.RC.LPush(ctx, PendingKey(b.KS.Queue("p", "high")), "h1").Err())
			r := step(t, g, StepArgs{Asks: []Ask{ask(b, "l1", "low", 3)}})
			require.Equal(t, []AskReply{{Taken: true}}, r.Asks, "two free slots, one job pending above: room for both")
			r = step(t, g, StepArgs{Asks: []Ask{ask(b, "l2", "low", 3)}})
			require.Equal(t, []AskReply{{Taken: false}}, r.Asks, "the last free slot is the pending high job's")
			require.Equal(t, GatePause, pausedValue(t, b, "low"), "and the low queue is paused for it")
			// An operator's pause of the high queue: its jobs do not count.
			require.NoError(t, b.RC.Set(ctx, PausedKey(b.KS.Queue("p", "high")), "1700000000", 0).Err())
			require.Equal(t, []AskReply{{Taken: true}}, step(t, g, StepArgs{Asks: []Ask{ask(b, "l2", "low", 3)}}).Asks)
			require.NoError(t, b.RC.Del(ctx, PausedKey(b.KS.Queue("p", "high"))).Err())
			step(t, g, StepArgs{Frees: []Free{{Member: member(b, "l2", "low"), Ran: true}}})
			// Nor do they while the gate itself keeps their queue paused (a
			// start rate, a grace, an aged tier served alone): nobody
			// dequeues them until a later call opens it.
			require.NoError(t, b.RC.Set(ctx, PausedKey(b.KS.Queue("p", "high")), GatePause, 0).Err())
			require.Equal(t, []AskReply{{Taken: true}}, step(t, g, StepArgs{Asks: []Ask{ask(b, "l4", "low", 3)}}).Asks)
			step(t, g, StepArgs{Frees: []Free{{Member: member(b, "l4", "low"), Ran: true}}})
			// Patience: a job that has waited a second goes anyway (no worker
			// may be free to dequeue the high job).
			r = step(t, g, StepArgs{Asks: []Ask{{Member: member(b, "l3", "low"), Rank: 3, Waited: 1500 * time.Millisecond}}})
			require.Equal(t, []AskReply{{Taken: true}}, r.Asks)
		}},
		scriptCase{script: "gate_step", name: "a waiter held back for a higher tier's pending jobs takes a free slot once its patience is over", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 2, func(c *SlotGateConfig) { c.Strict = true })
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "l1", "low", 3)}}).Asks[0].Taken)
			require.NoError(t, b.RC.LPush(ctx, PendingKey(b.KS.Queue("p", "high")), "h1").Err())
			first := time.Now()
			require.False(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "l2", "low", 3)}}).Asks[0].Taken, "the free slot is the pending high job's")
			ws, _ := waiters(t, b, g)
			require.Equal(t, []string{member(b, "l2", "low")}, ws)
			// Nobody dequeues h1. l2 asks again and again, as a waiter
			// does; it keeps its place and its first question's time, and
			// takes the slot only once that is PENDING_PATIENCE (1 s) old.
			var took time.Time
			testwait.For(t, 10*time.Second, "l2 to take the free slot", func() bool {
				if step(t, g, StepArgs{Asks: []Ask{ask(b, "l2", "low", 3)}}).Asks[0].Taken {
					took = time.Now()
					return true
				}
				return false
			})
			// Redis's clock counts whole milliseconds: a few are allowed.
			require.GreaterOrEqual(t, took.Sub(first), time.Second-5*time.Millisecond, "taken before its patience was over")
			require.Equal(t, map[string]string{member(b, "l1", "low"): "P1", member(b, "l2", "low"): "P1"}, leases(t, b, g))
			ws, _ = waiters(t, b, g)
			require.Empty(t, ws)
		}},
		scriptCase{script: "gate_step", name: "a freed slot is not handed to a lower tier's waiter while a higher tier's pending jobs need it", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 1, func(c *SlotGateConfig) { c.Strict = true })
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "low", 3)}}).Asks[0].Taken)
			other := testGate(b, "P2", 1, func(c *SlotGateConfig) { c.Strict = true })
			asked := time.Now()
			require.False(t, step(t, other, StepArgs{Asks: []Ask{ask(b, "l", "low", 3)}}).Asks[0].Taken, "the pool is full")
			// A high job is enqueued, and "a" ends: the release would hand
			// the slot to P2's waiter, but the high job needs it.
			require.NoError(t, b.RC.LPush(ctx, PendingKey(b.KS.Queue("p", "high")), "h1").Err())
			r := step(t, g, StepArgs{Frees: []Free{{Member: member(b, "a", "low"), Ran: true}}})
			if time.Since(asked) >= 900*time.Millisecond {
				// The rule holds a waiter back for a second from its first
				// question; a stall this long leaves nothing to check.
				t.Skipf("the machine stalled %s between the low job's question and the release", time.Since(asked))
			}
			require.Zero(t, r.Count, "the slot stays free")
			require.Empty(t, leases(t, b, g))
			ws, _ := waiters(t, b, g)
			require.Equal(t, []string{member(b, "l", "low")}, ws, "the low job still waits, in its place")
			// asynq dequeues the high job and it asks: the slot is still
			// free for it.
			dequeue(t, b, "h1", "high")
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "h1", "high", 1)}}).Asks[0].Taken)
			require.Equal(t, map[string]string{member(b, "h1", "high"): "P1"}, leases(t, b, g))
		}},
		scriptCase{script: "gate_step", name: "a reply counts a higher tier's pending jobs as a waiter of their tier", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 2, func(c *SlotGateConfig) { c.Strict = true })
			r := step(t, g, StepArgs{Asks: []Ask{ask(b, "l1", "low", 3)}})
			require.Equal(t, 0, r.OtherRank, "room, nobody waiting, nothing pending above: slots may be taken over")
			require.NoError(t, b.RC.LPush(ctx, PendingKey(b.KS.Queue("p", "low")), "l9").Err())
			require.Equal(t, 0, step(t, g, StepArgs{}).OtherRank, "the lowest tier's pending jobs hold nobody back")
			require.NoError(t, b.RC.LPush(ctx, PendingKey(b.KS.Queue("p", "mid")), "m1").Err())
			require.Equal(t, -1, step(t, g, StepArgs{}).OtherRank, "the one free slot is the pending mid job's: no take-over")
			// Full (l2 waited past the patience), no other process waiting:
			// the pending mid job counts as a waiter of its tier that has
			// waited no time.
			r = step(t, g, StepArgs{Asks: []Ask{{Member: member(b, "l2", "low"), Rank: 3, Waited: 1500 * time.Millisecond}}})
			require.Equal(t, []AskReply{{Taken: true}}, r.Asks)
			require.Equal(t, 2, r.Count)
			require.Equal(t, 2, r.OtherRank)
			require.Zero(t, r.OtherAge)
			// Another process's high waiter outranks it.
			other := testGate(b, "P2", 2, func(c *SlotGateConfig) { c.Strict = true })
			require.False(t, step(t, other, StepArgs{Asks: []Ask{ask(b, "h1", "high", 1)}}).Asks[0].Taken)
			require.Equal(t, 1, step(t, g, StepArgs{}).OtherRank)
		}},
		scriptCase{script: "gate_step", name: "a waiter of a higher tier goes before a job of a lower one", run: func(t *testing.T, b backend) {
			g := testGate(b, "P1", 1, func(c *SlotGateConfig) { c.Strict = true })
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "low", 3)}}).Asks[0].Taken)
			other := testGate(b, "P2", 1, func(c *SlotGateConfig) { c.Strict = true })
			require.False(t, step(t, other, StepArgs{Asks: []Ask{ask(b, "h", "high", 1)}}).Asks[0].Taken)
			// P1's job ends while its next job, of tier low, asks: the slot
			// goes to P2's high waiter, not to P1's own job.
			r := step(t, g, StepArgs{Frees: []Free{{Member: member(b, "a", "low")}}, Asks: []Ask{ask(b, "l", "low", 3)}})
			require.Equal(t, []AskReply{{Taken: false}}, r.Asks)
			require.Equal(t, 1, r.Count)
			require.Equal(t, map[string]string{member(b, "h", "high"): "P2"}, leases(t, b, g))
			ws, _ := waiters(t, b, g)
			require.Equal(t, []string{member(b, "l", "low")}, ws)
			require.Equal(t, 0, r.OtherRank, "the only waiter left is P1's own")
		}},
		scriptCase{script: "gate_step", name: "a job taken back from a dead worker asks with the place kept for it, ahead of its tier's waiters", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 1, func(c *SlotGateConfig) { c.Strict = true })
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "mid", 2)}}).Asks[0].Taken)
			require.False(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "w1", "mid", 2), ask(b, "w2", "mid", 2)}}).Asks[0].Taken)
			// lua/recover_job.lua kept a place for "r", of tier mid, at
			// the head of its tier; it asks again from another process.
			kept := member(b, "r", "mid")
			keepPlace(t, b.RC, g, kept, 2e13+1700000000)
			other := testGate(b, "P2", 1, func(c *SlotGateConfig) { c.Strict = true })
			require.False(t, step(t, other, StepArgs{Asks: []Ask{ask(b, "r", "mid", 2)}}).Asks[0].Taken, "the pool is full")
			ws, _ := waiters(t, b, g)
			require.Equal(t, []string{kept, member(b, "w1", "mid"), member(b, "w2", "mid")}, ws, "first among its tier's waiters")
			require.Zero(t, b.RC.HExists(ctx, g.Keys().Places, kept).Val(), "the place moved into the line")
			// The slot frees: it goes to the taken-back job.
			step(t, g, StepArgs{Frees: []Free{{Member: member(b, "a", "mid")}}})
			require.Equal(t, map[string]string{kept: "P2"}, leases(t, b, g))
		}},
		scriptCase{script: "gate_step", name: "a freed slot is kept for a job taken back before it asks, ahead of the waiters behind its place", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 1, func(c *SlotGateConfig) { c.Strict = true })
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "mid", 2)}}).Asks[0].Taken)
			require.False(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "w1", "mid", 2)}}).Asks[0].Taken)
			kept := member(b, "r", "mid")
			keepPlace(t, b.RC, g, kept, 2e13+1700000000)
			r := step(t, g, StepArgs{Frees: []Free{{Member: member(b, "a", "mid")}}})
			require.Equal(t, 1, r.Count, "the slot is held for the taken-back job")
			require.Equal(t, map[string]string{kept: "(kept for a job taken back)"}, leases(t, b, g))
			ws, _ := waiters(t, b, g)
			require.Equal(t, []string{member(b, "w1", "mid")}, ws, "the waiter behind its place still waits")
			// It asks from another process and takes the kept slot.
			other := testGate(b, "P2", 1, func(c *SlotGateConfig) { c.Strict = true })
			require.True(t, step(t, other, StepArgs{Asks: []Ask{ask(b, "r", "mid", 2)}}).Asks[0].Taken)
			require.Equal(t, map[string]string{kept: "P2"}, leases(t, b, g))
			require.Zero(t, b.RC.HLen(ctx, g.Keys().Places).Val())
		}},
		scriptCase{script: "gate_step", name: "a lapsed slot is not handed on while asynq still leases its job, then kept for it once taken back", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 1, nil)
			a := member(b, "a", "high")
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}}).Asks[0].Taken)
			// P1 dies running "a": its slot lease lapses while asynq still
			// leases the job (nobody finished it, nobody took it back yet).
			q := b.KS.Queue("p", "high")
			require.NoError(t, b.RC.LPush(ctx, ActiveKey(q), "a").Err())
			require.NoError(t, b.RC.ZAdd(ctx, LeaseKey(q), redisZ(recoverySeen, "a")).Err())
			require.NoError(t, b.RC.ZAdd(ctx, g.Keys().Leases, redisZ(1, a)).Err())
			other := testGate(b, "P2", 1, nil)
			require.False(t, step(t, other, StepArgs{Asks: []Ask{ask(b, "w", "high", 1)}}).Asks[0].Taken, "the slot is not free yet")
			require.Equal(t, map[string]string{a: "P1"}, leases(t, b, g))
			// Taken back: the slot is kept for it, the waiter still waits,
			// and a release (the keeper's tick) hands it to nobody else.
			r, err := b.KS.RecoverJob(ctx, b.RC, Member{ID: "a", Queue: q}, recoverySeen, "p", &RecoverPlace{Rank: 1, Keep: time.Minute}, time.Hour)
			require.NoError(t, err)
			require.Equal(t, Recovered, r.Outcome)
			require.Equal(t, "P1", r.Holder)
			_, err = other.Release(ctx, "")
			require.NoError(t, err)
			require.Equal(t, map[string]string{a: keptHolder}, leases(t, b, g))
			// Dequeued again by P2, it asks and takes its slot at once.
			require.True(t, step(t, other, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}}).Asks[0].Taken)
			require.Equal(t, map[string]string{a: "P2"}, leases(t, b, g))
		}},
		scriptCase{script: "gate_step", name: "a waiting job gives its worker back to a job taken back, once per such job, keeping its place", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			rc := b.RC
			q := b.KS.Queue("p", "high")
			g := testGate(b, "P1", 1, nil)
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}}).Asks[0].Taken)
			// P2 dequeued w1 and w2 (asynq: active, leased); they wait.
			dequeued := func(ids ...string) {
				for _, id := range ids {
					require.NoError(t, rc.LPush(ctx, ActiveKey(q), id).Err())
					require.NoError(t, rc.ZAdd(ctx, LeaseKey(q), redisZ(recoverySeen+100, id)).Err())
					require.NoError(t, rc.HSet(ctx, TaskKey(q, id), "state", "active").Err())
				}
			}
			dequeued("w1", "w2")
			p2 := testGate(b, "P2", 1, nil)
			r := step(t, p2, StepArgs{Asks: []Ask{ask(b, "w1", "high", 1)}})
			require.False(t, r.Asks[0].Taken || r.Asks[0].HandedBack)
			r = step(t, p2, StepArgs{Asks: []Ask{ask(b, "w2", "high", 1)}})
			require.False(t, r.Asks[0].Taken || r.Asks[0].HandedBack, "no job taken back: nothing to give a worker to")
			w2 := member(b, "w2", "high")
			place := rc.ZScore(ctx, g.Keys().Waiting, w2).Val()
			// A job taken back waits at the head of the queue, "x" behind it.
			require.NoError(t, rc.RPush(ctx, PendingKey(q), "x", "r").Err())
			require.NoError(t, rc.HSet(ctx, TaskKey(q, "r"), "state", "pending").Err())
			keepPlace(t, rc, g, member(b, "r", "high"), 1e13+recoverySeen)
			r = step(t, p2, StepArgs{Asks: []Ask{ask(b, "w1", "high", 1), ask(b, "w2", "high", 1)}})
			require.Equal(t, []AskReply{{}, {HandedBack: true}}, r.Asks, "the worst-placed of the two gives its worker")
			require.Equal(t, []string{"x", "w2", "r"}, rc.LRange(ctx, PendingKey(q), 0, -1).Val(), "back in the queue just behind the job taken back")
			require.Equal(t, []string{"w1"}, rc.LRange(ctx, ActiveKey(q), 0, -1).Val())
			require.Zero(t, rc.ZScore(ctx, LeaseKey(q), "w2").Val())
			require.Equal(t, "pending", rc.HGet(ctx, TaskKey(q, "w2"), "state").Val())
			require.Equal(t, place, rc.ZScore(ctx, g.Keys().Waiting, w2).Val(), "its place in the line is kept")
			require.Zero(t, rc.HExists(ctx, g.Keys().WaitProcs, w2).Val(), "no slot is handed to it meanwhile")
			// One worker per job taken back: w1 keeps its worker.
			r = step(t, p2, StepArgs{Asks: []Ask{ask(b, "w1", "high", 1)}})
			require.Equal(t, []AskReply{{}}, r.Asks)
			// The freed worker dequeues the job taken back; w2, dequeued
			// again, asks with its old place.
			require.Equal(t, "r", rc.RPopLPush(ctx, PendingKey(q), ActiveKey(q)).Val())
			require.NoError(t, rc.HSet(ctx, TaskKey(q, "r"), "state", "active").Err())
			require.Equal(t, "w2", rc.RPopLPush(ctx, PendingKey(q), ActiveKey(q)).Val())
			r = step(t, p2, StepArgs{Asks: []Ask{ask(b, "w2", "high", 1)}})
			require.Equal(t, []AskReply{{}}, r.Asks)
			require.Equal(t, place, rc.ZScore(ctx, g.Keys().Waiting, w2).Val())
			require.Equal(t, "P2", rc.HGet(ctx, g.Keys().WaitProcs, w2).Val())
		}},
		scriptCase{script: "gate_release", name: "a lapsed slot whose job asynq no longer leases is freed and handed on", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 1, nil)
			a := member(b, "a", "high")
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}}).Asks[0].Taken)
			other := testGate(b, "P2", 1, nil)
			require.False(t, step(t, other, StepArgs{Asks: []Ask{ask(b, "w", "high", 1)}}).Asks[0].Taken)
			// P1 dies; asynq's recoverer took "a" out of its lease set.
			require.NoError(t, b.RC.ZAdd(ctx, g.Keys().Leases, redisZ(1, a)).Err())
			_, err := other.Release(ctx, "")
			require.NoError(t, err)
			require.Equal(t, map[string]string{member(b, "w", "high"): "P2"}, leases(t, b, g))
		}},
		scriptCase{script: "gate_step", name: "a lapsed slot whose job asks again in the call is freed for the next job of the same call", run: func(t *testing.T, b backend) {
			// P2 held j's slot and stopped renewing it; asynq still leases j,
			// which a new attempt in P1 asks for now, with x behind it. Once
			// j waits in line its old slot is freed, and x, asking in the same
			// call, takes it (j waits behind its own lapsed lease no more).
			ctx := context.Background()
			p2 := testGate(b, "P2", 1, nil)
			j := member(b, "j", "high")
			require.True(t, step(t, p2, StepArgs{Asks: []Ask{ask(b, "j", "high", 1)}}).Asks[0].Taken)
			require.NoError(t, b.RC.ZAdd(ctx, p2.Keys().Leases, redisZ(1, j)).Err())
			require.NoError(t, b.RC.ZAdd(ctx, LeaseKey(b.KS.Queue("p", "high")), redisZ(float64(time.Now().Add(time.Minute).Unix()), "j")).Err())
			p1 := testGate(b, "P1", 1, nil)
			r := step(t, p1, StepArgs{Asks: []Ask{ask(b, "j", "high", 1), ask(b, "x", "high", 1)}})
			require.Equal(t, []AskReply{{}, {Taken: true}}, r.Asks)
			require.Equal(t, map[string]string{member(b, "x", "high"): "P1"}, leases(t, b, p1))
		}},
		scriptCase{script: "gate_release", name: "places kept without their mark are marked by the keeper's tick", run: func(t *testing.T, b backend) {
			// A recovery by a process of an earlier version keeps a place
			// and sets no mark: the keeper's tick marks it, with the places'
			// expiry, so the next call sees the place.
			ctx := context.Background()
			g := testGate(b, "P1", 1, nil)
			r := member(b, "r", "high")
			require.NoError(t, b.RC.HSet(ctx, g.Keys().Places, r, 1e13+1700000000).Err())
			require.NoError(t, b.RC.PExpire(ctx, g.Keys().Places, time.Minute).Err())
			_, err := g.Release(ctx, "")
			require.NoError(t, err)
			require.Equal(t, "1", b.RC.Get(ctx, g.Keys().PlacesMark).Val())
			ttl := b.RC.PTTL(ctx, g.Keys().PlacesMark).Val()
			require.True(t, ttl > 50*time.Second && ttl <= time.Minute, "the mark lapses with the places: %s", ttl)
			// The free slot is kept for the job taken back, which takes it.
			require.False(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}}).Asks[0].Taken, "the free slot is kept for r")
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "r", "high", 1)}}).Asks[0].Taken)
			require.Equal(t, map[string]string{r: "P1"}, leases(t, b, g))
		}},
		scriptCase{script: "gate_step", name: "many waiting do not pause the queues while a job taken back has yet to be dequeued", run: func(t *testing.T, b backend) {
			g := testGate(b, "P1", 1, nil)
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}}).Asks[0].Taken)
			var asks []Ask
			for i := range 4 {
				asks = append(asks, ask(b, fmt.Sprint("w", i), "high", 1))
			}
			step(t, g, StepArgs{Asks: asks})
			require.Equal(t, GatePause, pausedValue(t, b, "high"), "four waiting for a pool of one: paused")
			keepPlace(t, b.RC, g, member(b, "r", "high"), 1e13+1700000000)
			step(t, g, StepArgs{})
			require.Equal(t, "", pausedValue(t, b, "high"), "open, so that the job taken back is dequeued")
			other := testGate(b, "P2", 1, nil)
			step(t, other, StepArgs{Asks: []Ask{ask(b, "r", "high", 1)}})
			require.Equal(t, GatePause, pausedValue(t, b, "high"), "paused again once it asked")
		}},
		scriptCase{script: "gate_step", name: "a higher tier's waiter goes before a job taken back", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 1, func(c *SlotGateConfig) { c.Strict = true })
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "mid", 2)}}).Asks[0].Taken)
			require.False(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "h", "high", 1)}}).Asks[0].Taken)
			keepPlace(t, b.RC, g, member(b, "r", "mid"), 2e13+1700000000)
			step(t, g, StepArgs{Frees: []Free{{Member: member(b, "a", "mid")}}})
			require.Equal(t, map[string]string{member(b, "h", "high"): "P1"}, leases(t, b, g))
			require.Equal(t, int64(1), b.RC.HLen(ctx, g.Keys().Places).Val(), "it keeps its place")
		}},
		scriptCase{script: "gate_step", name: "a free handed on keeps the count and writes the lease as the process's", run: func(t *testing.T, b backend) {
			g := testGate(b, "P1", 1, nil)
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}}).Asks[0].Taken)
			r := step(t, g, StepArgs{Frees: []Free{{Member: member(b, "a", "high"), To: member(b, "b", "high")}}})
			require.Equal(t, 1, r.Count)
			require.Equal(t, map[string]string{member(b, "b", "high"): "P1"}, leases(t, b, g))
		}},
		scriptCase{script: "gate_step", name: "a free handed on to a job that never asked moves the lease and leaves the line alone", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g1, g2 := testGate(b, "P1", 1, nil), testGate(b, "P2", 1, nil)
			require.True(t, step(t, g1, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}}).Asks[0].Taken)
			require.False(t, step(t, g2, StepArgs{Asks: []Ask{ask(b, "w", "high", 1)}}).Asks[0].Taken)
			r := step(t, g1, StepArgs{Frees: []Free{{Member: member(b, "a", "high"), To: member(b, "b", "high"), Ran: true, ToNew: true}}})
			require.Equal(t, 1, r.Count, "the count never moves")
			require.Equal(t, map[string]string{member(b, "b", "high"): "P1"}, leases(t, b, g1))
			require.Equal(t, []string{member(b, "w", "high")}, b.RC.ZRange(ctx, g1.Keys().Waiting, 0, -1).Val(), "the other process's waiter keeps its place")
			r = step(t, g1, StepArgs{Frees: []Free{{Member: member(b, "b", "high"), Ran: true}}})
			require.Equal(t, map[string]string{member(b, "w", "high"): "P2"}, leases(t, b, g1), "the slot freed goes to the waiter")
			require.Empty(t, b.RC.ZRange(ctx, g1.Keys().Waiting, 0, -1).Val())
		}},
		scriptCase{script: "gate_step", name: "a first question takes its place in line as of the wait it reports", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 1, nil)
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}}).Asks[0].Taken)
			require.False(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "early", "high", 1)}}).Asks[0].Taken)
			late := ask(b, "waited", "high", 1)
			late.Waited = time.Minute
			require.False(t, step(t, g, StepArgs{Asks: []Ask{late}}).Asks[0].Taken)
			require.Equal(t, []string{member(b, "waited", "high"), member(b, "early", "high")}, b.RC.ZRange(ctx, g.Keys().Waiting, 0, -1).Val(),
				"the question that reported a minute's wait is ahead")
			late.Waited = 2 * time.Minute
			step(t, g, StepArgs{Asks: []Ask{late}})
			require.Equal(t, member(b, "waited", "high"), b.RC.ZRange(ctx, g.Keys().Waiting, 0, 0).Val()[0], "asked again, it keeps its place")
		}},
		scriptCase{script: "gate_step", name: "a free only frees what the calling process holds", run: func(t *testing.T, b backend) {
			g1, g2 := testGate(b, "P1", 2, nil), testGate(b, "P2", 2, nil)
			require.True(t, step(t, g2, StepArgs{Asks: []Ask{ask(b, "d", "high", 1)}}).Asks[0].Taken)
			r := step(t, g1, StepArgs{Frees: []Free{{Member: member(b, "d", "high")}}})
			require.Equal(t, 1, r.Count, "P1's late release of a copy of the job frees nothing")
			require.Equal(t, map[string]string{member(b, "d", "high"): "P2"}, leases(t, b, g1))
		}},
		scriptCase{script: "gate_step", name: "a full pool tells who waits elsewhere; one with room and nobody waiting says none", run: func(t *testing.T, b backend) {
			g1, g2 := testGate(b, "P1", 1, nil), testGate(b, "P2", 1, nil)
			r := step(t, g1, StepArgs{})
			require.Equal(t, 0, r.OtherRank, "room, nobody waiting")
			r = step(t, g1, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}})
			require.Equal(t, 0, r.OtherRank, "full, nobody waiting")
			require.False(t, step(t, g2, StepArgs{Asks: []Ask{ask(b, "w", "mid", 2)}}).Asks[0].Taken)
			r = step(t, g1, StepArgs{})
			require.Equal(t, 1, r.OtherRank, "without strict tiers every waiter ranks 1")
			require.GreaterOrEqual(t, r.OtherAge, time.Duration(0))
			require.Less(t, r.OtherAge, 10*time.Second)
		}},
		scriptCase{script: "gate_step", name: "an operator's size wins over the configured one", run: func(t *testing.T, b backend) {
			g := testGate(b, "P1", 3, nil)
			require.NoError(t, b.RC.Set(context.Background(), g.Keys().Size, 1, 0).Err())
			r := step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1), ask(b, "b", "high", 1)}})
			require.Equal(t, 1, r.Size)
			require.Equal(t, []AskReply{{Taken: true}, {Taken: false}}, r.Asks)
		}},
		scriptCase{script: "gate_step", name: "a start rate spaces the starts out and says when the next is due", run: func(t *testing.T, b backend) {
			g := testGate(b, "P1", 5, func(c *SlotGateConfig) { c.StartInterval, c.StartBurst = 2*time.Second, 1 })
			r := step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1), ask(b, "b", "high", 1)}})
			require.True(t, r.Asks[0].Taken)
			require.Equal(t, time.Duration(0), r.Asks[0].Wait)
			require.False(t, r.Asks[1].Taken)
			require.Greater(t, r.Asks[1].Wait, time.Second)
			require.LessOrEqual(t, r.Asks[1].Wait, 2*time.Second)
			require.Equal(t, -1, r.OtherRank, "a start rate must see every freed slot")
			tat, err := b.RC.Get(context.Background(), g.Keys().StartRate).Result()
			require.NoError(t, err, "the start rate's state is written")
			_, err = strconv.ParseFloat(tat, 64)
			require.NoError(t, err)
		}},
		scriptCase{script: "gate_step", name: "reservations keep a slot for the tiers above", run: func(t *testing.T, b backend) {
			g := testGate(b, "P1", 2, func(c *SlotGateConfig) {
				c.Strict, c.Steering = true, []TierSteering{{Reserved: 1}, {}, {}}
			})
			r := step(t, g, StepArgs{Asks: []Ask{ask(b, "l1", "low", 3), ask(b, "l2", "low", 3), ask(b, "h1", "high", 1)}})
			require.Equal(t, []AskReply{{Taken: true}, {Taken: false}, {Taken: true}}, r.Asks, "the last slot is high's")
		}},
		scriptCase{script: "gate_step", name: "a lower tier's job leaves the slots a higher tier's pending jobs may take, reservations counted", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 3, func(c *SlotGateConfig) {
				c.Strict, c.Steering = true, []TierSteering{{Reserved: 1}, {}, {}}
			})
			require.NoError(t, b.RC.LPush(ctx, PendingKey(b.KS.Queue("p", "mid")), "m1").Err())
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "l1", "low", 3)}}).Asks[0].Taken, "three free: one for m1, one kept for high, one left")
			// Two free, one of them kept for high: the other is m1's.
			require.False(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "l2", "low", 3)}}).Asks[0].Taken, "the slot m1 may take is m1's")
			// m1 is dequeued and asks: it takes that slot.
			dequeue(t, b, "m1", "mid")
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "m1", "mid", 2)}}).Asks[0].Taken)
			require.Equal(t, map[string]string{member(b, "l1", "low"): "P1", member(b, "m1", "mid"): "P1"}, leases(t, b, g))
		}},
		scriptCase{script: "gate_step", name: "a higher tier's pending jobs use up its reservation: a lower tier's job that leaves room for all of them goes", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 3, func(c *SlotGateConfig) {
				c.Strict, c.Steering = true, []TierSteering{{Reserved: 1}, {}, {}}
			})
			require.NoError(t, b.RC.LPush(ctx, PendingKey(b.KS.Queue("p", "high")), "h1").Err())
			require.NoError(t, b.RC.LPush(ctx, PendingKey(b.KS.Queue("p", "mid")), "m1").Err())
			// Three free: h1 takes the one kept for high, m1 another, and
			// one is left.
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "l1", "low", 3)}}).Asks[0].Taken)
			dequeue(t, b, "h1", "high")
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "h1", "high", 1)}}).Asks[0].Taken)
			dequeue(t, b, "m1", "mid")
			require.True(t, step(t, g, StepArgs{Asks: []Ask{ask(b, "m1", "mid", 2)}}).Asks[0].Taken)
			require.Len(t, leases(t, b, g), 3)
		}},
		scriptCase{script: "gate_step", name: "a recovery grace admits nothing new", run: func(t *testing.T, b backend) {
			g := testGate(b, "P1", 3, nil)
			_, err := g.Renew(context.Background(), RenewArgs{Grace: 5 * time.Second})
			require.NoError(t, err)
			r := step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}})
			require.Equal(t, []AskReply{{Taken: false}}, r.Asks)
			require.Equal(t, 0, r.Count)
			require.Equal(t, -1, r.OtherRank, "no hand-on in a grace either")
		}},

		scriptCase{script: "gate_release", name: "a freed slot goes to the best waiter, whose process hears of it", run: func(t *testing.T, b backend) {
			strict := func(c *SlotGateConfig) { c.Strict = true }
			g1, g2, g3 := testGate(b, "P1", 1, strict), testGate(b, "P2", 1, strict), testGate(b, "P3", 1, strict)
			require.True(t, step(t, g1, StepArgs{Asks: []Ask{ask(b, "a", "low", 3)}}).Asks[0].Taken)
			require.False(t, step(t, g2, StepArgs{Asks: []Ask{ask(b, "m", "mid", 2)}}).Asks[0].Taken)
			require.False(t, step(t, g3, StepArgs{Asks: []Ask{ask(b, "h", "high", 1)}}).Asks[0].Taken)
			heard2, heard3 := subscribe(t, g2), subscribe(t, g3)

			r, err := g1.Release(context.Background(), member(b, "a", "low"))
			require.NoError(t, err)
			require.Equal(t, ReleaseReply{Count: 1}, r, "the slot went to another process's waiter")
			require.Equal(t, map[string]string{member(b, "h", "high"): "P3"}, leases(t, b, g1), "the higher tier's waiter, though it asked last")
			ws, _ := waiters(t, b, g1)
			require.Equal(t, []string{member(b, "m", "mid")}, ws)
			require.Equal(t, Freed{Granted: []string{member(b, "h", "high")}}, nextFreed(t, heard3))
			// P2 was handed nothing: the grant's message is nothing to it,
			// so the first it hears is an "ask again" sent after it.
			require.NoError(t, b.RC.Publish(context.Background(), g1.Keys().Freed, "1").Err())
			require.Equal(t, Freed{AskAgain: true}, nextFreed(t, heard2))
		}},
		scriptCase{script: "gate_release", name: "a slot handed to the calling process's own waiter comes back in the reply", run: func(t *testing.T, b backend) {
			g := testGate(b, "P1", 1, nil)
			r := step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1), ask(b, "b", "high", 1)}})
			require.Equal(t, []AskReply{{Taken: true}, {Taken: false}}, r.Asks)
			rel, err := g.Release(context.Background(), member(b, "a", "high"))
			require.NoError(t, err)
			require.Equal(t, ReleaseReply{Count: 1, Granted: []string{member(b, "b", "high")}}, rel)
			require.Equal(t, map[string]string{member(b, "b", "high"): "P1"}, leases(t, b, g))
		}},
		scriptCase{script: "gate_release", name: "a job that gives up leaves the waiters", run: func(t *testing.T, b backend) {
			g := testGate(b, "P1", 1, nil)
			step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1), ask(b, "w", "high", 1)}})
			other := testGate(b, "P2", 1, nil)
			rel, err := other.Release(context.Background(), member(b, "w", "high"))
			require.NoError(t, err)
			require.Equal(t, 1, rel.Count)
			ws, _ := waiters(t, b, g)
			require.Equal(t, []string{member(b, "w", "high")}, ws, "another process's give-up does not touch P1's waiter")
			_, err = g.Release(context.Background(), member(b, "w", "high"))
			require.NoError(t, err)
			ws, _ = waiters(t, b, g)
			require.Empty(t, ws)
			require.Equal(t, map[string]string{member(b, "a", "high"): "P1"}, leases(t, b, g))
		}},
		scriptCase{script: "gate_release", name: "the keeper's tick drops what dead processes left and settles", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 1, func(c *SlotGateConfig) { c.Strict = true })
			k := g.Keys()
			past := float64(time.Now().Add(-time.Minute).UnixMilli())
			dead := member(b, "dead", "high")
			require.NoError(t, b.RC.ZAdd(ctx, k.Leases, redis.Z{Score: past, Member: dead}).Err())
			require.NoError(t, b.RC.HSet(ctx, k.Holders, dead, "P0").Err())
			gone := member(b, "gone", "high")
			require.NoError(t, b.RC.ZAdd(ctx, k.Waiting, redis.Z{Score: 1e13, Member: gone}).Err())
			require.NoError(t, b.RC.ZAdd(ctx, k.WaitExpiry, redis.Z{Score: past, Member: gone}).Err())
			require.NoError(t, b.RC.HSet(ctx, k.WaitProcs, gone, "P0").Err())
			require.NoError(t, b.RC.LPush(ctx, PendingKey(b.KS.Queue("p", "mid")), "m1").Err())

			r, err := g.Release(ctx, "")
			require.NoError(t, err)
			require.Equal(t, ReleaseReply{Count: 0}, r)
			require.Empty(t, leases(t, b, g))
			ws, _ := waiters(t, b, g)
			require.Empty(t, ws)
			require.Equal(t, GatePause, pausedValue(t, b, "low"), "settled: strict order below mid")
			require.Equal(t, "", pausedValue(t, b, "mid"))
		}},

		scriptCase{script: "gate_renew", name: "a renewal extends only leases that exist", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 2, nil)
			a, freed := member(b, "a", "high"), member(b, "f", "high")
			require.NoError(t, b.RC.ZAdd(ctx, g.Keys().Leases, redis.Z{Score: float64(time.Now().Add(time.Second).UnixMilli()), Member: a}).Err())
			require.NoError(t, b.RC.HSet(ctx, g.Keys().Holders, a, "P1").Err())
			n, err := g.Renew(ctx, RenewArgs{Members: []string{a, freed}})
			require.NoError(t, err)
			require.Equal(t, 1, n, "a slot just freed never comes back")
			score, err := b.RC.ZScore(ctx, g.Keys().Leases, a).Result()
			require.NoError(t, err)
			require.InDelta(t, float64(time.Now().Add(testLeaseTTL).UnixMilli()), score, 5000)
			require.Equal(t, map[string]string{a: "P1"}, leases(t, b, g))
			exists, err := b.RC.Exists(ctx, g.Keys().Grace).Result()
			require.NoError(t, err)
			require.Zero(t, exists, "no grace asked")
		}},
		scriptCase{script: "gate_renew", name: "a recovery re-adds lapsed leases and starts the grace", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g := testGate(b, "P1", 2, nil)
			a := member(b, "a", "high")
			n, err := g.Renew(ctx, RenewArgs{Members: []string{a}, Readd: true, Grace: 5 * time.Second})
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Equal(t, map[string]string{a: "P1"}, leases(t, b, g))
			ttl, err := b.RC.PTTL(ctx, g.Keys().Grace).Result()
			require.NoError(t, err)
			require.Greater(t, ttl, 3*time.Second)
			require.LessOrEqual(t, ttl, 5*time.Second)
			// A shorter grace never cuts a longer one short.
			_, err = g.Renew(ctx, RenewArgs{Readd: true, Grace: 100 * time.Millisecond})
			require.NoError(t, err)
			ttl, err = b.RC.PTTL(ctx, g.Keys().Grace).Result()
			require.NoError(t, err)
			require.Greater(t, ttl, 3*time.Second)
		}},

		scriptCase{script: "gate_clear", name: "only the gate's pauses are lifted", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			qs := []string{b.KS.Queue("p", "high"), b.KS.Queue("p", "mid"), b.KS.Queue("p", "low")}
			for q, v := range map[string]string{qs[0]: GatePause, qs[1]: "1700000000", qs[2]: BreakerPause} {
				require.NoError(t, b.RC.Set(ctx, PausedKey(q), v, 0).Err())
			}
			require.NoError(t, ClearGatePauses(ctx, b.RC, qs))
			require.Equal(t, "", pausedValue(t, b, "high"))
			require.Equal(t, "1700000000", pausedValue(t, b, "mid"), "an operator's pause stays")
			require.Equal(t, BreakerPause, pausedValue(t, b, "low"), "a breaker's pause stays")
		}},

		scriptCase{script: "gate_announce", name: "processes say what they can run; a stopped or lapsed one drops out", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			g1 := testGate(b, "P1", 3, func(c *SlotGateConfig) { c.Capacity = 4 })
			g2 := testGate(b, "P2", 3, func(c *SlotGateConfig) { c.Capacity = 6 })
			a, err := g1.Announce(ctx, true)
			require.NoError(t, err)
			require.Equal(t, Announced{Processes: 1, Capacity: 4}, a)
			a, err = g2.Announce(ctx, true)
			require.NoError(t, err)
			require.Equal(t, Announced{Processes: 2, Capacity: 10}, a)
			k := g1.Keys()
			caps, err := b.RC.HGetAll(ctx, k.Procs).Result()
			require.NoError(t, err)
			require.Equal(t, map[string]string{"P1": "4", "P2": "6"}, caps)
			score, err := b.RC.ZScore(ctx, k.ProcsSeen, "P1").Result()
			require.NoError(t, err)
			require.InDelta(t, float64(time.Now().Add(testLeaseTTL).UnixMilli()), score, 5000)

			require.NoError(t, b.RC.Set(ctx, k.Size, 2, 0).Err())
			a, err = g2.Announce(ctx, false)
			require.NoError(t, err)
			require.Equal(t, Announced{OperatorSize: 2, Processes: 1, Capacity: 4}, a, "P2 stopped")

			// P1 dies: its word lapses, and the next announce drops it.
			require.NoError(t, b.RC.ZAdd(ctx, k.ProcsSeen, redis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: "P1"}).Err())
			a, err = g2.Announce(ctx, true)
			require.NoError(t, err)
			require.Equal(t, Announced{OperatorSize: 2, Processes: 1, Capacity: 6}, a)
			caps, err = b.RC.HGetAll(ctx, k.Procs).Result()
			require.NoError(t, err)
			require.Equal(t, map[string]string{"P2": "6"}, caps)
		}},

		// Not a script: the INFO call a recovery makes to tell a failover.
		scriptCase{script: "gate_server_id", name: "the server holding the pool's keys names itself", run: func(t *testing.T, b backend) {
			g := testGate(b, "P1", 1, nil)
			id, err := g.ServerID(context.Background())
			if b.Redis.Mini != nil {
				// The embedded Redis reports no run_id: a recovery then goes
				// by the clock alone.
				if err == nil {
					require.Empty(t, id)
				}
				return
			}
			require.NoError(t, err)
			require.Len(t, id, 40, "a real Redis reports its run_id")
			again, err := g.ServerID(context.Background())
			require.NoError(t, err)
			require.Equal(t, id, again)
		}},
	)
}

// TestSlotGateArguments pins what the scripts are given from a config:
// the keys in the order gate_lib.lua reads them, and the fixed arguments
// as every process has always encoded them.
func TestSlotGateArguments(t *testing.T) {
	ks := NewKeyspace("ns", false)
	qs := []string{ks.Queue("batch", "high"), ks.Queue("batch", "low")}
	g := NewSlotGate(nil, ks, SlotGateConfig{
		Pool: "batch", Queues: qs, Size: 4, Strict: true, Process: "host:1:abc", LeaseTTL: 15 * time.Second,
		StartInterval: 2500 * time.Microsecond, StartBurst: 3, Capacity: 6,
		Steering: []TierSteering{{Reserved: 1}, {MaxWait: 90 * time.Second}},
	})
	require.Equal(t, []string{
		"ns:gate:batch:leases", "ns:gate:batch:waiting", "ns:gate:batch:waiting:expiry", "ns:gate:batch:leases:holders", "ns:gate:batch:leases:grace",
		"asynq:{ns:batch:high}:paused", "asynq:{ns:batch:low}:paused", "asynq:{ns:batch:high}:pending", "asynq:{ns:batch:low}:pending",
		"asynq:{ns:batch:high}:active", "asynq:{ns:batch:low}:active", "asynq:{ns:batch:high}:lease", "asynq:{ns:batch:low}:lease",
		"ns:gate:batch:start-rate", "ns:gate:batch:size", "ns:gate:batch:aged", "ns:gate:batch:waiting:recovered:mark", "ns:gate:batch:waiting:recovered", "ns:gate:batch:waiting:handbacks", "ns:gate:batch:waiting:procs",
	}, g.scriptKeys)
	require.Equal(t, []any{"4", "2", "host:1:abc", "15000", "1", "ns:gate:batch:leases:freed", "2.5", "3", "1:0,0:90000,"}, g.stepHead)
	require.Equal(t, []any{"4", "", "2", "ns:gate:batch:leases:freed", "1", "2.5", "3", "1:0,0:90000,", "15000", "host:1:abc"}, g.releaseArgs)
	require.Equal(t, []string{"ns:gate:batch:procs", "ns:gate:batch:procs:seen", "ns:gate:batch:size"}, g.announceKeys)

	plain := NewSlotGate(nil, ks, SlotGateConfig{Pool: "batch", Queues: qs[:1], Size: 2, Process: "p", LeaseTTL: time.Second})
	require.Equal(t, []any{"2", "1", "p", "1000", "0", "ns:gate:batch:leases:freed", "0", "0", ""}, plain.stepHead,
		"no start rate, no steering")
}

// TestGateRepliesOfTheWrongShape: a reply that is not what the script
// returns is an error naming the call, never a panic.
func TestGateRepliesOfTheWrongShape(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  []any
		asks int
	}{
		{"empty", nil, 0},
		{"short", []any{int64(1), int64(0), int64(2)}, 0},
		{"a count that is no integer", []any{"1", int64(0), int64(2), int64(0), int64(0)}, 0},
		{"fewer answers than asks", []any{int64(1), int64(1), int64(2), int64(0), int64(0)}, 1},
		{"another number of asks", []any{int64(1), int64(2), int64(2), int64(0), int64(0), int64(1), int64(0)}, 1},
		{"an answer that is no integer", []any{int64(1), int64(1), int64(2), int64(0), int64(0), "1", int64(0)}, 1},
		{"a grant that is no member", []any{int64(1), int64(0), int64(2), int64(0), int64(0), int64(7)}, 0},
	} {
		t.Run("step/"+tc.name, func(t *testing.T) {
			_, err := parseStep(tc.res, tc.asks)
			require.ErrorContains(t, err, "gate step: unexpected reply")
		})
	}
	r, err := parseStep([]any{int64(2), int64(1), int64(2), int64(1), int64(40), int64(0), int64(25), "w@q"}, 1)
	require.NoError(t, err)
	require.Equal(t, StepReply{Count: 2, Size: 2, OtherRank: 1, OtherAge: 40 * time.Millisecond,
		Asks: []AskReply{{Wait: 25 * time.Millisecond}}, Granted: []string{"w@q"}}, r)

	for _, res := range [][]any{nil, {"1"}, {int64(1), int64(2)}} {
		_, err := parseRelease(res)
		require.ErrorContains(t, err, "gate release: unexpected reply")
	}
}

// TestFreedMessages: what a process reads of the freed channel's messages.
func TestFreedMessages(t *testing.T) {
	for _, tc := range []struct {
		name, payload string
		want          Freed
	}{
		{"ask again", "1", Freed{AskAgain: true}},
		{"grants, this process's among them", "g\nP1\ta@q\nP2\tb@q\nP1\tc@q", Freed{Granted: []string{"a@q", "c@q"}}},
		{"grants to other processes only", "g\nP2\tb@q", Freed{}},
		{"a line without a process", "g\na@q\nP1\td@q", Freed{Granted: []string{"d@q"}}},
		{"a message this version does not know: asking again is safe", "x", Freed{AskAgain: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, parseFreed(tc.payload, "P1"))
		})
	}
}

// TestScriptsUseThePauseMarker: the gate's Lua spells the pause marker the
// Go side uses to tell its own pauses from an operator's.
func TestScriptsUseThePauseMarker(t *testing.T) {
	for name, src := range map[string]string{"gate_lib.lua": gateLib, "gate_clear.lua": gateClearLua} {
		require.True(t, strings.Contains(src, `"`+GatePause+`"`), name)
	}
}

// TestScriptsKeepSlotsAlike: lua/recover_job.lua keeps a taken-back job's
// slot as lua/gate_lib.lua does (keepSlots), with the holder and time the
// Go side passes it.
func TestScriptsKeepSlotsAlike(t *testing.T) {
	require.Contains(t, gateLib, `local KEPT = "`+keptHolder+`"`)
	require.Contains(t, gateLib, fmt.Sprintf("local KEEP_MS = %d\n", keptFor.Milliseconds()))
}

// keepPlace keeps a place in the line for member, as a recovery does
// (lua/recover_job.lua): the place, and the mark the gate reads first.
func keepPlace(t *testing.T, rc redis.UniversalClient, g *SlotGate, member string, place float64) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, rc.HSet(ctx, g.Keys().Places, member, place).Err())
	require.NoError(t, rc.Set(ctx, g.Keys().PlacesMark, "1", time.Minute).Err())
}
