package queues

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/priority"
	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// plainGate returns the gate of a cluster-scoped pool "p" of size, without
// tiers, on its own test Redis and namespace.
func plainGate(t *testing.T, size int) (*gate, *testredis.Redis, Config) {
	t.Helper()
	r := testredis.New(t)
	cfg := Config{Namespace: r.Namespace(t), Pools: []PoolConfig{{Name: "p", Size: size, JobTypes: []string{"x"}}}}.WithDefaults()
	reg, err := newRegistry(cfg, rdb.NewKeyspace(cfg.Namespace, false), nil)
	require.NoError(t, err)
	return newGate(r.Client, rdb.NewKeyspace(cfg.Namespace, false), reg.pools[0], newProcessID(), time.Now), r, cfg
}

// keys returns the keys of g's pool's gate, for tests to look at.
func (g *gate) keys() rdb.Gate { return g.ks.Gate(g.name) }

// TestRenewalNeverBringsBackAFreedSlot: renewals running while jobs take
// and free slots never re-add a slot just freed (a "ghost" that would hold
// a slot for a whole lease with no job behind it).
func TestRenewalNeverBringsBackAFreedSlot(t *testing.T) {
	t.Parallel()
	g, r, cfg := plainGate(t, 4)
	ctx := context.Background()

	stop := make(chan struct{})
	var renewals sync.WaitGroup
	renewals.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				g.renew(ctx)
			}
		}
	})
	var jobs sync.WaitGroup
	for w := range 4 {
		jobs.Go(func() {
			for i := range 150 {
				m, err := g.acquire(ctx, fmt.Sprintf("job-%d-%d", w, i), QueueName(cfg.Namespace, "p", ""))
				require.NoError(t, err)
				g.release(ctx, m)
			}
		})
	}
	jobs.Wait()
	close(stop)
	renewals.Wait()
	g.sendOps() // the last releases may still be held back (releaseLater)
	n, err := r.Client.ZCard(ctx, g.keys().Leases).Result()
	require.NoError(t, err)
	require.Zero(t, n, "a freed slot came back")
}

// TestEnqueueManyHigherTiersFirst: a batch enqueues a strict pool's higher
// tiers before its lower ones, whatever order it lists them in, so an idle
// worker does not find a lower tier's job of the batch before a higher
// one's is there. (asynq's pending_since, set at enqueue, tells the order.)
func TestEnqueueManyHigherTiersFirst(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	tiers, err := priority.New(priority.Config{Tiers: []string{"regulatory", "close", "adhoc"}, Default: "adhoc"})
	require.NoError(t, err)
	c, err := NewClient(r.Client, Config{Namespace: r.Namespace(t), Tiers: tiers,
		Pools: []PoolConfig{{Name: "batch", Size: 1, JobTypes: []string{"report:run"}, Tiers: []string{"adhoc", "close", "regulatory"}}}})
	require.NoError(t, err)
	var reqs []Request
	for i, tier := range []string{"adhoc", "adhoc", "close", "regulatory", "adhoc", "regulatory", "close"} {
		reqs = append(reqs, Request{JobType: "report:run", Payload: []byte(fmt.Sprint(i)), Options: EnqueueOptions{Tier: tier}})
	}
	res, err := c.EnqueueMany(context.Background(), reqs)
	require.NoError(t, err)
	type enq struct {
		rank  int
		since int64
		seq   int
	}
	var order []enq
	p := c.Pools()[0]
	for i, x := range res {
		since, err := r.Client.HGet(context.Background(), rdb.TaskKey(x.Queue, x.ID), "pending_since").Int64()
		require.NoError(t, err)
		order = append(order, enq{p.rank(x.Queue), since, i})
	}
	sort.Slice(order, func(a, b int) bool { return order[a].since < order[b].since })
	var got []int
	for _, e := range order {
		got = append(got, e.seq)
	}
	require.Equal(t, []int{3, 5, 2, 6, 0, 1, 4}, got, "highest tier first, then in the batch's order within a tier")
}

// TestRecoveryGraceAfterAFailover: a Sentinel failover promotes a replica
// that may have missed the last lease writes, however short the outage. A
// recovery that finds another Redis server (its run_id changed) starts the
// grace in which nothing new is admitted; a short outage of the same
// server does not, nor does a server that reports no run_id.
func TestRecoveryGraceAfterAFailover(t *testing.T) {
	t.Parallel()
	g, r, _ := plainGate(t, 2)
	ctx := context.Background()
	if r.Mini == nil {
		id, err := g.conf.Load().slots.ServerID(ctx)
		require.NoError(t, err)
		require.Len(t, id, 40, "a real Redis reports its run_id")
	}
	var mu sync.Mutex
	server := "server-a"
	g.identify = func(context.Context) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		return server, nil
	}
	switchTo := func(s string) {
		mu.Lock()
		server = s
		mu.Unlock()
	}
	graceKey := g.keys().Grace
	graced := func() bool {
		n, err := r.Client.Exists(ctx, graceKey).Result()
		require.NoError(t, err)
		return n == 1
	}
	g.learnServer(ctx)

	g.failed(ctx)
	require.NoError(t, g.recover(ctx))
	require.False(t, graced(), "a short outage of the same server needs no grace")

	switchTo("server-b")
	g.failed(ctx)
	require.NoError(t, g.recover(ctx))
	require.True(t, graced(), "another server answers after a short outage: the grace runs")
	ttl, err := r.Client.PTTL(ctx, graceKey).Result()
	require.NoError(t, err)
	require.LessOrEqual(t, ttl, gateRecoveryGrace)

	require.NoError(t, r.Client.Del(ctx, graceKey).Err())
	switchTo("")
	g.failed(ctx)
	require.NoError(t, g.recover(ctx))
	require.False(t, graced(), "a server that reports no run_id leaves the decision to the clock")
}

// TestLateReleaseNeverFreesAnotherProcesssSlot: a release that reaches
// Redis late (held back, or sent after a failed call) names a job that may
// run again elsewhere by now, a copy under the same member (asynq's
// recoverer, a retry). It frees only a slot its own process holds.
func TestLateReleaseNeverFreesAnotherProcesssSlot(t *testing.T) {
	t.Parallel()
	g1, r, cfg := plainGate(t, 2)
	g2 := newGate(r.Client, rdb.NewKeyspace(cfg.Namespace, false), g1.conf.Load().pool, newProcessID(), time.Now)
	ctx := context.Background()
	q := QueueName(cfg.Namespace, "p", "")
	m, err := g2.acquire(ctx, "d", q) // the copy, running in process 2
	require.NoError(t, err)

	// Process 1's late release of "d", by the step script and by the
	// release script.
	require.NoError(t, g1.submit(&gateOp{release: m}).err)
	_, err = g1.release1(ctx, m)
	require.NoError(t, err)
	holder, err := r.Client.HGet(ctx, g1.keys().Holders, m).Result()
	require.NoError(t, err)
	require.Equal(t, g2.processID, holder, "process 2's slot is still its own")
	require.EqualValues(t, 1, r.Client.ZCard(ctx, g1.keys().Leases).Val())

	g2.release(ctx, m)
	g2.sendOps()
	require.Zero(t, r.Client.ZCard(ctx, g1.keys().Leases).Val(), "its own release frees it")
}

// TestHeldReleaseIsSentWhenItsTimerFoundCallsInFlight: a release held back
// (releaseLater) whose timer fires while gateMaxInFlight calls are in
// flight goes with the first of them to end, however young it is: no
// other timer is due for it, so it would otherwise wait for the process's
// next call to the gate and hold its slot until its lease expired.
func TestHeldReleaseIsSentWhenItsTimerFoundCallsInFlight(t *testing.T) {
	t.Parallel()
	g, r, cfg := plainGate(t, 2)
	ctx := context.Background()
	m, err := g.acquire(ctx, "d", QueueName(cfg.Namespace, "p", ""))
	require.NoError(t, err)

	// A timer armed for an earlier release is due, and two calls are in
	// flight, when "d" ends: its release is held behind that timer.
	holdCalls(g, true)
	g.release(ctx, m)
	g.bmu.Lock()
	require.Len(t, g.queue, 1, "held back")
	// That timer fires: its flush finds the calls in flight and sends
	// nothing.
	g.lazyDue = false
	g.bmu.Unlock()
	g.flush(false)
	// The calls end, the first one flushing what is queued.
	g.bmu.Lock()
	g.inFlight = 0
	g.bmu.Unlock()
	g.flush(false)
	require.Zero(t, r.Client.ZCard(ctx, g.keys().Leases).Val(), "the held release went with the next flush")
}
