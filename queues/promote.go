package queues

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// ErrJobNotFound is matched by Promote for a job ID that no queue of the
// pool holds: never enqueued, or finished and not kept. Nothing changed.
var ErrJobNotFound = errors.New("job not found")

// ErrInvalidPromote is matched by Promote for what was asked: a job type
// routed to no pool, a pool without tiers, a tier the pool does not serve,
// an empty job ID. Redis was not touched.
var ErrInvalidPromote = errors.New("invalid promote request")

// promoteAttempts bounds how often Promote reads a job again when its
// message changed between the read and the move (it failed and went to
// its retry set, say). Each attempt is two round trips.
const promoteAttempts = 20

// PromoteResult says what Promote did.
type PromoteResult struct {
	// ID and Pool name the job.
	ID   string `json:"id"`
	Pool string `json:"pool"`
	// From is the tier the job was found in, To the tier asked for.
	From string `json:"from"`
	To   string `json:"to"`
	// Queue is the queue the job is in now.
	Queue string `json:"queue"`
	// State is the job's state when Promote looked: pending, scheduled or
	// retry when it was moved (it keeps it); active, completed, archived
	// when it was not.
	State string `json:"state"`
	// Moved says whether the job changed queues. It is false for a job
	// that runs or finished (State says which), and for a job already in
	// the tier asked for.
	Moved bool `json:"moved"`
}

// Waiting reports whether the job was waiting (pending, scheduled or
// waiting for a retry) when Promote looked.
func (r PromoteResult) Waiting() bool {
	return r.State == "pending" || r.State == "scheduled" || r.State == "retry"
}

// Promote moves a waiting job of jobType's pool (pending, scheduled, or
// waiting for a retry) to the queue of another of the pool's tiers, in one
// Redis step: at every moment the job is in exactly one queue, so a worker
// dequeuing at the same time either takes it from the old tier (and
// Promote reports it running) or finds it in the new one.
//
// The job keeps its ID, payload, headers, retry count and options, and its
// state: a pending job goes to the tail of the new tier's queue (behind
// the jobs already waiting there, as if enqueued now into that tier); a
// scheduled job or one waiting for a retry keeps its due time and joins
// the new tier's queue when due. The failures counted against it and the
// circuit breaker's memory of it follow it. No pause flag is touched: see
// docs/STEERING.md for how soon a worker takes a job moved into a tier the
// cluster gate holds paused.
//
// A job that runs, or finished and is kept (completed within its
// retention, or archived), is not moved: the result says so (State,
// Moved false), and so it does for a job already in the tier. A job no
// queue of the pool holds fails with ErrJobNotFound; a bad request
// (see ErrInvalidPromote) fails before Redis is touched. On any error
// nothing changed.
func (c *Client) Promote(ctx context.Context, jobType, id, tier string) (PromoteResult, error) {
	p, err := c.pools().route(jobType)
	if err != nil {
		return PromoteResult{}, fmt.Errorf("%w: %w", ErrInvalidPromote, err)
	}
	if id == "" {
		return PromoteResult{}, fmt.Errorf("%w: the job ID is empty", ErrInvalidPromote)
	}
	if p.tiers == nil {
		return PromoteResult{}, fmt.Errorf("%w: pool %q has no tiers", ErrInvalidPromote, p.Name())
	}
	target, err := p.QueueFor(tier)
	if err != nil {
		return PromoteResult{}, fmt.Errorf("%w: %w", ErrInvalidPromote, err)
	}
	res := PromoteResult{ID: id, Pool: p.Name(), To: tier}
	for range promoteAttempts {
		job, err := c.jobs.FindJob(ctx, p.queues, id)
		if err != nil {
			return PromoteResult{}, err
		}
		from, state := job.Queue, job.State
		if from == "" {
			return PromoteResult{}, fmt.Errorf("%w: pool %q has no job %q (never enqueued, or finished and not kept)", ErrJobNotFound, p.Name(), id)
		}
		res.From, res.Queue, res.State = p.TierOf(from), from, state
		if from == target {
			return res, nil
		}
		if !res.Waiting() {
			return res, nil
		}
		var readyAt time.Time // a pending job's wait restarts in its new tier
		if state == "pending" {
			readyAt = c.cfg.Clock()
		}
		newMsg, lock, err := rdb.Retarget(job.Msg, from, target, readyAt)
		if err != nil {
			return PromoteResult{}, fmt.Errorf("promote job %q: %w", id, err)
		}
		// asynq's tools list queues from its set of queue names: the
		// target goes in first, in a call of its own (a global key, on
		// its own slot on a Redis Cluster).
		if err := c.publishQueue(ctx, target); err != nil {
			return PromoteResult{}, fmt.Errorf("promote job %q: %w", id, err)
		}
		reply, err := c.jobs.Promote(ctx, rdb.PromoteArgs{Pool: p.Name(), ID: id, From: from, To: target, Msg: job.Msg, NewMsg: newMsg, Lock: lock})
		if err != nil {
			return PromoteResult{}, err
		}
		switch reply.Outcome {
		case rdb.Moved:
			res.Queue, res.State, res.Moved = target, reply.State, true
			return res, nil
		case rdb.NotWaiting:
			res.State = reply.State
			return res, nil
		case rdb.Conflict:
			return PromoteResult{}, fmt.Errorf("promote job %q from tier %q to %q: %s; nothing was moved", id, res.From, tier, reply.Why)
		}
		// Changed or Gone: it moved on between the read and the script (a
		// failure, a retry forwarded, another promote); look again.
	}
	return PromoteResult{}, fmt.Errorf("promote job %q: it changed under every one of %d attempts; nothing was moved, try again", id, promoteAttempts)
}
