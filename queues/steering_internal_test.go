package queues

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/priority"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// steeringGate builds a strict pool of the three test tiers with the given
// size and steering, and its gate, on a test Redis.
func steeringGate(t *testing.T, size int, reserved map[string]int, maxWait map[string]time.Duration) (*gate, *testredis.Redis, Config) {
	t.Helper()
	r := testredis.New(t)
	tiers, err := priority.New(priority.Config{Tiers: []string{"regulatory", "close", "adhoc"}, Default: "adhoc"})
	require.NoError(t, err)
	cfg := Config{Namespace: r.Namespace(t), Tiers: tiers, Pools: []PoolConfig{{Name: "batch", Size: size, JobTypes: []string{"x"},
		Tiers: []string{"regulatory", "close", "adhoc"}, Reserved: reserved, MaxWait: maxWait}}}.WithDefaults()
	require.NoError(t, cfg.Validate())
	reg, err := newRegistry(cfg, rdb.NewKeyspace(cfg.Namespace, false), nil)
	require.NoError(t, err)
	return newGate(r.Client, rdb.NewKeyspace(cfg.Namespace, false), reg.pools[0], newProcessID(), time.Now), r, cfg
}

// tryAcquire asks for a slot once, giving up at once if none is given.
func tryAcquire(t *testing.T, g *gate, id, tier string) bool {
	t.Helper()
	q, err := g.conf.Load().pool.QueueFor(tier)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	_, err = g.acquire(ctx, id, q)
	if errors.Is(err, errGateWait) {
		return false
	}
	require.NoError(t, err)
	return true
}

// pend puts job id in queue q's pending list as asynq does, pending since
// since (no stamp when since is zero), at the tail or, with head, at the
// head that asynq dequeues next.
func pend(t *testing.T, r *testredis.Redis, q, id string, since time.Time, head bool) {
	t.Helper()
	ctx := context.Background()
	fields := []any{"state", "pending"}
	if !since.IsZero() {
		fields = append(fields, "pending_since", strconv.FormatInt(since.UnixNano(), 10))
	}
	require.NoError(t, r.Client.HSet(ctx, rdb.TaskKey(q, id), fields...).Err())
	push := r.Client.LPush
	if head {
		push = r.Client.RPush
	}
	require.NoError(t, push(ctx, rdb.PendingKey(q), id).Err())
}

func paused(t *testing.T, r *testredis.Redis, g *gate, tier string) bool {
	t.Helper()
	q, err := g.conf.Load().pool.QueueFor(tier)
	require.NoError(t, err)
	v, err := r.Client.Exists(context.Background(), rdb.PausedKey(q)).Result()
	require.NoError(t, err)
	return v == 1
}

// TestReservationRule: with one slot of four reserved for regulatory and
// one for close (and the tiers above), adhoc gets two, close three, and
// regulatory every free slot; the pause flags keep the reserved tiers'
// queues open and pause the others as soon as only reserved room is left.
func TestReservationRule(t *testing.T) {
	t.Parallel()
	g, r, _ := steeringGate(t, 4, map[string]int{"regulatory": 1, "close": 1}, nil)
	ctx := context.Background()
	// Pending work in every tier, so strict order alone would open only
	// regulatory: what is asserted below is the reservation's doing.
	for _, tier := range []string{"regulatory", "close", "adhoc"} {
		q, _ := g.conf.Load().pool.QueueFor(tier)
		require.NoError(t, r.Client.LPush(ctx, rdb.PendingKey(q), "pending-"+tier).Err())
	}

	require.True(t, tryAcquire(t, g, "a1", "adhoc"))
	require.True(t, tryAcquire(t, g, "a2", "adhoc"))
	require.False(t, tryAcquire(t, g, "a3", "adhoc"), "the third adhoc job would take a reserved slot")
	require.True(t, tryAcquire(t, g, "c1", "close"), "close may take the slot reserved for close")
	require.False(t, tryAcquire(t, g, "c2", "close"), "the last slot is regulatory's")
	require.True(t, paused(t, r, g, "adhoc") && paused(t, r, g, "close"), "only reserved room left: lower tiers paused")
	require.False(t, paused(t, r, g, "regulatory"), "the reserved tier's queue stays open")
	require.True(t, tryAcquire(t, g, "r1", "regulatory"))

	// Regulatory in a close slot: free two adhoc slots, and regulatory may
	// take them; then close's reservation is used by regulatory ("or
	// higher"), and adhoc may take a slot only if one beyond it is free.
	g.release(ctx, "a1@"+g.conf.Load().pool.queues[2])
	g.release(ctx, "a2@"+g.conf.Load().pool.queues[2])
	require.True(t, tryAcquire(t, g, "r2", "regulatory"))
	// The higher tiers' pending jobs are dequeued (a lower tier's job
	// leaves them the free slots they need otherwise, for a while).
	for _, tier := range []string{"regulatory", "close"} {
		q, _ := g.conf.Load().pool.QueueFor(tier)
		require.NoError(t, r.Client.Del(ctx, rdb.PendingKey(q)).Err())
	}
	require.True(t, tryAcquire(t, g, "a4", "adhoc"), "regulatory jobs cover both reservations: the last slot is open to all")
	require.False(t, tryAcquire(t, g, "r3", "regulatory"), "the pool is full")
	n, err := r.Client.ZCard(ctx, g.keys().Leases).Result()
	require.NoError(t, err)
	require.EqualValues(t, 4, n)
}

// TestReservationWaiterDoesNotBlockTheReservedTier: a lower-tier job that
// was dequeued and waits (a reservation holds it back) does not hold back
// the tier the reservation is for, even though it asked first.
func TestReservationWaiterDoesNotBlockTheReservedTier(t *testing.T) {
	t.Parallel()
	g, _, _ := steeringGate(t, 2, map[string]int{"regulatory": 1}, nil)
	require.True(t, tryAcquire(t, g, "a1", "adhoc"))
	require.False(t, tryAcquire(t, g, "c1", "close"), "the last slot is regulatory's")
	// A close job that asked before regulatory and still waits (a live
	// process keeps asking; tryAcquire gave up, so it is added by hand).
	cq, _ := g.conf.Load().pool.QueueFor("close")
	ctx := context.Background()
	require.NoError(t, g.rdb.ZAdd(ctx, g.keys().Waiting, redisZ(2e13, "c2@"+cq)).Err())
	require.NoError(t, g.rdb.ZAdd(ctx, g.keys().WaitExpiry, redisZ(float64(time.Now().Add(time.Minute).UnixMilli()), "c2@"+cq)).Err())
	require.True(t, tryAcquire(t, g, "r1", "regulatory"), "the close waiter may not take the reserved slot, so it does not hold regulatory back")
}

// TestAgedTierIsServedFirst: once the oldest adhoc job waited past its
// maximum wait, the gate opens only adhoc's queue and that job, marked
// aged, takes the next free slot ahead of a regulatory job that asks
// first; without an aged job, strict order holds.
func TestAgedTierIsServedFirst(t *testing.T) {
	t.Parallel()
	// A max wait of a minute: "young" must not age before the test's last
	// check on a stalled machine (with a second, it once did).
	g, r, _ := steeringGate(t, 1, nil, map[string]time.Duration{"adhoc": time.Minute})
	ctx := context.Background()
	rq, _ := g.conf.Load().pool.QueueFor("regulatory")
	aq, _ := g.conf.Load().pool.QueueFor("adhoc")
	pend(t, r, rq, "r1", time.Now(), false)
	pend(t, r, aq, "young", time.Now(), false)
	require.NoError(t, g.settle(ctx))
	require.False(t, paused(t, r, g, "regulatory"))
	require.True(t, paused(t, r, g, "adhoc"), "strict order while no adhoc job is over its limit")

	// An adhoc job pending for 5 minutes, at the head (asynq dequeues from the
	// right end).
	pend(t, r, aq, "old", time.Now().Add(-5*time.Minute), true)
	require.NoError(t, g.settle(ctx))
	require.True(t, paused(t, r, g, "regulatory"), "the aged tier is served first")
	require.False(t, paused(t, r, g, "adhoc"))

	// asynq dequeues it (the regulatory job was dequeued by a process that
	// found its queue open earlier): both ask; the aged one goes first.
	require.NoError(t, r.Client.RPop(ctx, rdb.PendingKey(aq)).Err())
	require.NoError(t, r.Client.LPush(ctx, rdb.ActiveKey(aq), "old").Err())
	require.NoError(t, r.Client.ZAdd(ctx, rdb.LeaseKey(aq), redisZ(float64(time.Now().Add(30*time.Second).Unix()), "old")).Err())
	require.False(t, tryAcquire(t, g, "r0", "regulatory"), "an aged job dequeued but not asked yet goes first")
	require.True(t, tryAcquire(t, g, "old", "adhoc"))
	g.release(ctx, "old@"+aq)
	require.False(t, paused(t, r, g, "regulatory"), "the young adhoc job is within its limit: strict order again")
	require.True(t, paused(t, r, g, "adhoc"))
}

// TestSteeringForTheScripts: the gate's scripts get a pool's reservations
// and maximum waits per tier, highest first, and nothing at all for a pool
// with neither (they skip the steering then).
func TestSteeringForTheScripts(t *testing.T) {
	t.Parallel()
	g, _, _ := steeringGate(t, 4, map[string]int{"regulatory": 1}, map[string]time.Duration{"adhoc": 90 * time.Second})
	require.Equal(t, []rdb.TierSteering{{Reserved: 1}, {}, {MaxWait: 90 * time.Second}}, g.conf.Load().pool.steering())
	g2, _, _ := steeringGate(t, 4, nil, nil)
	require.Nil(t, g2.conf.Load().pool.steering(), "no steering: the scripts skip it")
}

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }

// TestReservationWinsOverAging: an adhoc job past its maximum wait is not
// given a slot reserved for regulatory: with only reserved room left, the
// gate leaves regulatory's queue open, not adhoc's.
func TestReservationWinsOverAging(t *testing.T) {
	t.Parallel()
	g, r, _ := steeringGate(t, 2, map[string]int{"regulatory": 1}, map[string]time.Duration{"adhoc": time.Second})
	ctx := context.Background()
	aq, _ := g.conf.Load().pool.QueueFor("adhoc")
	require.True(t, tryAcquire(t, g, "a1", "adhoc"))
	pend(t, r, aq, "old", time.Now().Add(-time.Minute), false)
	require.NoError(t, g.settle(ctx))
	require.True(t, paused(t, r, g, "adhoc"), "the aged tier may not take the reserved slot")
	require.False(t, paused(t, r, g, "regulatory"))
	g.release(ctx, "a1@"+aq)
	require.False(t, paused(t, r, g, "adhoc"), "with an unreserved slot free, the aged tier is served")
	require.True(t, paused(t, r, g, "regulatory"), "and only it")
}

// TestAgingLooksPastAJobWithoutAStamp: a job put back at the head of its
// queue by a worker's shutdown has no pending_since; the guard reads the
// next job's stamp instead of never aging the tier.
func TestAgingLooksPastAJobWithoutAStamp(t *testing.T) {
	t.Parallel()
	g, r, _ := steeringGate(t, 1, nil, map[string]time.Duration{"adhoc": time.Second})
	ctx := context.Background()
	rq, _ := g.conf.Load().pool.QueueFor("regulatory")
	aq, _ := g.conf.Load().pool.QueueFor("adhoc")
	pend(t, r, rq, "r1", time.Now(), false)
	pend(t, r, aq, "old", time.Now().Add(-time.Minute), false)
	pend(t, r, aq, "back", time.Time{}, true) // the head, as asynq's requeue puts it
	require.NoError(t, g.settle(ctx))
	require.False(t, paused(t, r, g, "adhoc"), "the tier aged by the job behind the unstamped head")
	require.True(t, paused(t, r, g, "regulatory"))
	marked, err := r.Client.ZRange(ctx, g.keys().Aged, 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{"back@" + aq}, marked, "the job asynq dequeues next is the one marked")
}

// TestReservationsBeyondAResize: an operator resized a pool of 6 with
// three reserved slots down to 3 (or another process's config reserves
// more than this size allows): the lower tiers still get a slot when the
// pool is empty, rather than none for as long as the resize holds.
func TestReservationsBeyondAResize(t *testing.T) {
	t.Parallel()
	g, r, cfg := steeringGate(t, 6, map[string]int{"regulatory": 1, "close": 2}, nil)
	ctx := context.Background()
	require.NoError(t, r.Client.Set(ctx, rdb.NewKeyspace(cfg.Namespace, false).PoolSizeKey("batch"), 3, 0).Err())
	require.True(t, tryAcquire(t, g, "a1", "adhoc"), "an empty pool gives the lowest tier a slot")
	require.False(t, tryAcquire(t, g, "a2", "adhoc"), "the rest stays for the reserved tiers")
	require.True(t, tryAcquire(t, g, "r1", "regulatory"))
}
