// Package queuestest gives tests outside package queues the names of the
// engine's keys in Redis, so that a test that watches or disturbs the
// engine's state (a fault injection, an atomic observation) reads them
// from the one package that builds them, queues/internal/rdb, instead of
// spelling them itself. The engine never imports it; programs should not
// either: what a program needs is on queues.Client.
package queuestest

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// GateKeys returns the keys of a cluster-scoped pool's slot gate on rc's
// topology: the slots held (a sorted set of <job id>@<queue>, scored by the
// lease's expiry, Redis's clock in ms) and the jobs waiting for a slot.
func GateKeys(rc redis.UniversalClient, namespace, pool string) (leases, waiting string) {
	g := rdb.KeyspaceFor(namespace, rc).Gate(pool)
	return g.Leases, g.Waiting
}

// ClusterSlots reads a cluster-scoped pool's slots held across every worker
// process, by holder process (host:pid:id), in one step: the holders add
// up to active.
func ClusterSlots(ctx context.Context, rc redis.UniversalClient, namespace, pool string) (active int, holders map[string]int, err error) {
	slots, err := rdb.NewPools(rc, rdb.KeyspaceFor(namespace, rc)).Slots(ctx, pool)
	if err != nil {
		return 0, nil, err
	}
	holders = map[string]int{}
	for h, n := range slots.Holders {
		holders[h] = int(n)
	}
	return int(slots.InUse), holders, nil
}

// PausedKey is asynq's pause flag of a queue (any value pauses it).
func PausedKey(queue string) string { return rdb.PausedKey(queue) }

// BreakerStateKey is the hash holding a pool's circuit breaker's state.
func BreakerStateKey(rc redis.UniversalClient, namespace, pool string) string {
	state, _, _, _ := rdb.KeyspaceFor(namespace, rc).BreakerKeys(pool)
	return state
}

// Abandon takes the next pending job of a pool's queue (tier "" for a pool
// without tiers) on a single Redis and leaves it as a worker process that
// died leaves its job: running in asynq's eyes, its lease last renewed
// renewedAgo ago, by nobody since. It returns the job's ID, and undo,
// which puts the job back where it was.
func Abandon(ctx context.Context, rc redis.UniversalClient, namespace, pool, tier string, renewedAgo time.Duration) (id string, undo func() error, err error) {
	queue := rdb.NewKeyspace(namespace, false).Queue(pool, tier)
	id, err = rc.RPopLPush(ctx, rdb.PendingKey(queue), rdb.ActiveKey(queue)).Result()
	if err != nil {
		return "", nil, err
	}
	undo = func() error {
		_, err := rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.LRem(ctx, rdb.ActiveKey(queue), 0, id)
			p.ZRem(ctx, rdb.LeaseKey(queue), id)
			p.RPush(ctx, rdb.PendingKey(queue), id)
			p.HSet(ctx, rdb.TaskKey(queue, id), "state", "pending")
			return nil
		})
		return err
	}
	expiry := time.Now().Add(-renewedAgo).Add(30 * time.Second).Unix()
	if err := rc.ZAdd(ctx, rdb.LeaseKey(queue), redis.Z{Score: float64(expiry), Member: id}).Err(); err != nil {
		return "", nil, err
	}
	return id, undo, rc.HSet(ctx, rdb.TaskKey(queue, id), "state", "active").Err()
}
