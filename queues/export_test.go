package queues

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// SetBacklogRecount sets how old c's door lets the bound of a pool's
// backlog get before it counts exactly again (1s by default), so that a
// test can pin down when the count happens.
func SetBacklogRecount(c *Client, d time.Duration) { c.setBacklogRecount(d) }

// DoorScripts returns the SHA1 of the door's scripts: its fast path's and
// its general one's, so that a test can tell which one a call ran.
func DoorScripts() (fast, general string) { return rdb.DoorScriptHashes() }

// TakeOver does to job (queue, id) what another process's recovery does
// when the process running it stops answering: the job goes back to its
// queue and is noted as taken. It reports whether the job was running.
//
// The job's process renews the lease every 5 s; a renewal between the
// read of the lease and the script makes the script leave the job (as it
// should), so it tries again, a few times.
func TakeOver(c *Client, pool, queue, id string) (bool, error) {
	ctx := context.Background()
	for range 5 {
		score, err := c.rdb.ZScore(ctx, rdb.LeaseKey(queue), id).Result()
		if err != nil {
			return false, err
		}
		r, err := c.ks.RecoverJob(ctx, c.rdb, rdb.Member{ID: id, Queue: queue}, score, pool, c.run.recoverPlace(c.pools().byName[pool], queue), time.Minute)
		if err != nil || r.Outcome == rdb.Recovered {
			return r.Outcome == rdb.Recovered, err
		}
	}
	return false, nil
}

// Abandon leaves job (queue, id), pending in its queue, as a process that
// died right after taking it leaves it: running in asynq's eyes, with a
// lease nobody renews.
func Abandon(c *Client, queue, id string) error {
	ctx := context.Background()
	if err := c.rdb.LRem(ctx, rdb.PendingKey(queue), 0, id).Err(); err != nil {
		return err
	}
	if err := c.rdb.LPush(ctx, rdb.ActiveKey(queue), id).Err(); err != nil {
		return err
	}
	if err := c.rdb.ZAdd(ctx, rdb.LeaseKey(queue), redis.Z{Score: float64(time.Now().Add(30 * time.Second).Unix()), Member: id}).Err(); err != nil {
		return err
	}
	return c.rdb.HSet(ctx, rdb.TaskKey(queue, id), "state", "active").Err()
}

// SetRunStaleAfter sets how long a run's counts must stay still before a
// worker's keeper checks its jobs against asynq; the returned func puts
// the default back.
func SetRunStaleAfter(d time.Duration) func() {
	old := runStaleAfter.Swap(int64(d))
	return func() { runStaleAfter.Store(old) }
}
