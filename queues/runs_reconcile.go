package queues

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// A run's record learns of each job's end from the job's handler. A few
// ends never come that way: asynq archives a job whose worker crashed more
// often than its retries allow, or whose handler outlived its deadline, and
// a worker can fail to write an end during a long Redis outage. Such a run
// would never end. The keeper of each worker therefore looks, for a sealed
// run whose counts have not moved for runStaleAfter, at what asynq says of
// its queued and running jobs, and records the ends asynq knows of:
// completed (succeeded), archived (failed, with asynq's reason), or gone
// from every tier of its pool (failed). Jobs asynq still holds are left
// alone; a run that moves costs nothing here.

// runStaleAfter is how long a sealed run's counts must stay still before
// the keeper checks its jobs against asynq (1 minute; tests shorten it).
var runStaleAfter = func() *atomic.Int64 {
	var d atomic.Int64
	d.Store(int64(time.Minute))
	return &d
}()

// runReconcileEvery is how often the keeper reads the recent runs' counts
// to find the stale ones.
const runReconcileEvery = 5 * time.Second

// runReconcileRuns bounds how many recent runs the keeper looks at.
const runReconcileRuns = 50

// runStale remembers, per run, its counts as last read and since when.
type runStale struct {
	counts string
	since  time.Time
}

// reconcileRuns checks the sealed, unfinished runs among the most recent
// ones whose counts did not move for runStaleAfter; seen carries what the
// last call read.
func (c *Client) reconcileRuns(ctx context.Context, seen map[string]runStale, now time.Time) {
	recs, err := c.runs.List(ctx, runReconcileRuns)
	if err != nil {
		return
	}
	live := map[string]bool{}
	for _, rec := range recs {
		if rec.Fields["sealed"] != "1" || rec.Fields["ended"] != "" {
			continue
		}
		live[rec.ID] = true
		counts := countsKey(rec.Fields)
		st, ok := seen[rec.ID]
		if !ok || st.counts != counts {
			seen[rec.ID] = runStale{counts: counts, since: now}
			continue
		}
		if now.Sub(st.since) < time.Duration(runStaleAfter.Load()) {
			continue
		}
		if err := c.reconcileRun(ctx, rec.ID); err != nil {
			c.cfg.Logger.Warn("run: could not check its jobs against asynq", "run", rec.ID, "error", err)
		}
		seen[rec.ID] = runStale{counts: counts, since: now} // again after another quiet spell
	}
	for id := range seen {
		if !live[id] {
			delete(seen, id)
		}
	}
}

// countsKey is a run's counts as one comparable string.
func countsKey(f map[string]string) string {
	var parts []string
	for k, v := range f {
		if strings.HasPrefix(k, "n|") {
			parts = append(parts, k+"="+v)
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// reconcileRun records the ends asynq knows of for run id's queued and
// running jobs.
func (c *Client) reconcileRun(ctx context.Context, id string) error {
	rec, err := c.runs.Read(ctx, id, true)
	if err != nil {
		return err
	}
	var open []rdb.RunJob
	var members []rdb.Member
	for jobID, v := range rec.Jobs {
		state, tier, queue, _ := rdb.JobState(v)
		if state == rdb.RunQueued || state == rdb.RunRunning {
			open = append(open, rdb.RunJob{ID: jobID, Tier: tier, Queue: queue})
			members = append(members, rdb.Member{ID: jobID, Queue: queue})
		}
	}
	found, err := c.jobs.Lookup(ctx, members)
	if err != nil {
		return err
	}
	for i, j := range open {
		f := found[i]
		if f.Queue == "" {
			// Not where the record says: a promote may have moved it.
			if p := c.poolOfQueue(j.Queue); p != nil {
				if f, err = c.jobs.FindJob(ctx, p.queues, j.ID); err != nil {
					return err
				}
			}
		}
		state, reason := "", ""
		switch {
		case f.Queue == "" || rdb.TaskHeader(f.Msg, rdb.RunHeader) != id:
			state, reason = rdb.RunFailed, "its job is gone from asynq, and its end was never recorded"
		case f.State == "completed":
			state = rdb.RunSucceeded
		case f.State == "archived":
			state, reason = rdb.RunFailed, fmt.Sprintf("archived by asynq without its handler's verdict (worker crashes used up its retries, or it outlived its deadline): %s", rdb.TaskError(f.Msg))
		default:
			continue // pending, scheduled, retry, active: asynq still has it
		}
		if f.Queue != "" {
			j.Queue, j.Tier = f.Queue, ""
			if p := c.poolOfQueue(f.Queue); p != nil {
				j.Tier = p.TierOf(f.Queue)
			}
		}
		changed, due, err := c.runs.End(ctx, id, j, state, reason)
		if err != nil {
			return err
		}
		if changed {
			c.cfg.Logger.Warn("run: a job's end recorded from asynq's state; its handler never reported it", "run", id, "job_id", j.ID, "state", state, "reason", reason)
		}
		c.fireIfDue(ctx, id, due)
	}
	return nil
}

// poolOfQueue returns the pool that owns queue, nil for none.
func (c *Client) poolOfQueue(queue string) *Pool {
	for _, p := range c.pools().pools {
		if slices.Contains(p.queues, queue) {
			return p
		}
	}
	return nil
}
