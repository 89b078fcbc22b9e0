package queues

import (
	"context"
	"fmt"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// What a Redis Cluster changes in the engine's calls. The key layout
// (rdb.Keyspace) puts every key of one pool on one slot; this file splits the
// calls that span pools, which on a single Redis run as one, into one call
// per pool, and writes asynq's global set of queue names in calls of its
// own. docs/CLUSTER.md, "On a Redis Cluster", states what each split
// changes.

// publishQueue adds queue to asynq's set of queue names (its tools and
// Inspector list queues from it), once per client: in a call of its own,
// since on a Redis Cluster the set sits on a slot of its own.
func (c *Client) publishQueue(ctx context.Context, queue string) error {
	if _, ok := c.published.Load(queue); ok {
		return nil
	}
	if err := c.jobs.PublishQueue(ctx, queue); err != nil {
		return err
	}
	c.published.Store(queue, true)
	return nil
}

// slotGroups splits items into groups that a single script call may take:
// on a cluster one group per pool (pool(i) names item i's pool), in order
// of first appearance; on a single Redis one group of all.
func slotGroups[T any](ks rdb.Keyspace, items []T, pool func(T) string) [][]T {
	if !ks.Cluster() || len(items) == 0 {
		return [][]T{items}
	}
	at := map[string]int{}
	var out [][]T
	for _, it := range items {
		p := pool(it)
		k, ok := at[p]
		if !ok {
			k = len(out)
			at[p] = k
			out = append(out, nil)
		}
		out[k] = append(out[k], it)
	}
	return out
}

// publishFirst lists the call's queues in asynq's set beforehand, on a
// cluster, where the set is on a slot of its own and the script cannot
// write it (on a single Redis the script does it in the same step).
func (a *admitCall) publishFirst(ctx context.Context) error {
	if !a.c.ks.Cluster() {
		return nil
	}
	for _, r := range a.requests {
		for _, j := range r.jobs {
			if err := a.c.publishQueue(ctx, r.results[j.i].Queue); err != nil {
				return fmt.Errorf("enqueue: %w", err)
			}
		}
	}
	return nil
}

// doorPool names the pool of a door request's first job.
func doorPool(r *doorRequest) string { return r.pools[r.jobs[0].i].Name() }

// splitDoorRequest splits a request at the door into one request per pool
// on a cluster, sharing the batch's slices; nil when it needs no split.
func (c *Client) splitDoorRequest(r *doorRequest) []*doorRequest {
	groups := slotGroups(c.ks, r.jobs, func(j doorJob) string { return r.pools[j.i].Name() })
	if len(groups) < 2 {
		return nil
	}
	out := make([]*doorRequest, len(groups))
	for k, g := range groups {
		out[k] = &doorRequest{reqs: r.reqs, pools: r.pools, results: r.results, jobs: g, trace: r.trace}
	}
	return out
}

// admitEach takes a request whose jobs go to several pools through the
// door on a cluster, where no single step spans pools: pool by pool, in
// the order of the batch. When a pool refuses, the jobs the pools before
// it admitted are taken back (takeBack) before the refusal is returned, so
// nothing of the request stays; only a job that a worker started in
// between (the few milliseconds of the calls) cannot be taken back, and
// the error then says how many stay (their results still say Enqueued).
func (c *Client) admitEach(ctx context.Context, parts []*doorRequest) error {
	for k, part := range parts {
		err := c.admit(ctx, part)
		if err == nil {
			continue
		}
		var started []string
		for _, done := range parts[:k] {
			n, terr := c.takeBack(context.WithoutCancel(ctx), done)
			if terr != nil {
				return fmt.Errorf("%w; on a Redis Cluster the pools of a batch are admitted one after the other, and taking back the jobs admitted to pool %q failed: %w", err, doorPool(done), terr)
			}
			if n > 0 {
				started = append(started, fmt.Sprintf("%d in pool %q", n, doorPool(done)))
			}
		}
		if len(started) > 0 {
			return fmt.Errorf("%w; except: on a Redis Cluster the pools of a batch are admitted one after the other, and jobs admitted before the refusal had already started and stay (%v)", err, started)
		}
		return err
	}
	return nil
}

// takeBack removes the jobs a request wrote at the door that are still
// waiting (pending or scheduled), marks them NotEnqueued, and returns how
// many it could not take back because they had started or finished. One
// pool's jobs, one call.
func (c *Client) takeBack(ctx context.Context, r *doorRequest) (int, error) {
	var jobs []rdb.QueuedJob
	var at []int // their indexes in the batch
	for _, j := range r.jobs {
		res := r.results[j.i]
		if res.Outcome != Enqueued && res.Outcome != Replaced {
			continue // not written by this request
		}
		jobs = append(jobs, rdb.QueuedJob{Queue: res.Queue, ID: res.ID})
		at = append(at, j.i)
	}
	taken, err := c.jobs.TakeBack(ctx, jobs)
	if err != nil {
		return 0, err
	}
	kept := 0
	for k, i := range at {
		if taken[k] {
			r.results[i].Outcome = NotEnqueued
		} else {
			kept++
		}
	}
	return kept, nil
}
