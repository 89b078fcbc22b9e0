package rdb

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Jobs is the engine's enqueue side in Redis, for one client: the door's
// scripts (door.go), the unique-ID locks (locks.go), promote (promote.go)
// and the reads and writes that go with them. Its methods are safe for
// concurrent use; SetRecount is not, with them.
type Jobs struct {
	rc redis.UniversalClient
	ks Keyspace
	// recountArg is the door's recount interval as both of its scripts
	// take it (ms), boxed once: it goes into every call.
	recountArg any
}

// NewJobs returns the enqueue side over rc, in the layout ks, with the
// door's recount interval (SetRecount).
func NewJobs(rc redis.UniversalClient, ks Keyspace, recount time.Duration) *Jobs {
	j := &Jobs{rc: rc, ks: ks}
	j.SetRecount(recount)
	return j
}

// SetRecount sets how old a door's bound of a pool's backlog may get
// before a request is decided on an exact count again (see
// lua/admit.lua).
func (j *Jobs) SetRecount(d time.Duration) {
	j.recountArg = strconv.FormatInt(d.Milliseconds(), 10)
}

// PublishQueue adds queue to asynq's set of queue names, from which its
// tools and Inspector list queues. On a Redis Cluster the set has a slot of
// its own, so this is a call of its own.
func (j *Jobs) PublishQueue(ctx context.Context, queue string) error {
	if err := j.rc.SAdd(ctx, AllQueuesKey, queue).Err(); err != nil {
		return fmt.Errorf("list queue %q in asynq's set of queues: %w", queue, err)
	}
	return nil
}

// Exists reports, for each ID, whether any of queues holds a job with it,
// in any state. One pipelined round trip.
func (j *Jobs) Exists(ctx context.Context, queues, ids []string) ([]bool, error) {
	out := make([]bool, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	pipe := j.rc.Pipeline()
	cmds := make([]*redis.IntCmd, 0, len(ids)*len(queues))
	for _, id := range ids {
		for _, q := range queues {
			cmds = append(cmds, pipe.Exists(ctx, TaskKey(q, id)))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("look up jobs: %w", err)
	}
	for i := range ids {
		for _, cmd := range cmds[i*len(queues) : (i+1)*len(queues)] {
			out[i] = out[i] || cmd.Val() > 0
		}
	}
	return out, nil
}

// FoundJob is a job FindJob found: its queue, its asynq state and its
// task message ("" if its hash has none). Queue is "" when no queue holds
// the job.
type FoundJob struct{ Queue, State, Msg string }

// FindJob returns the job with id in the first of queues that holds one
// (in the order given: the pool's highest tier first). One pipelined round
// trip.
func (j *Jobs) FindJob(ctx context.Context, queues []string, id string) (FoundJob, error) {
	pipe := j.rc.Pipeline()
	cmds := make([]*redis.SliceCmd, len(queues))
	for i, q := range queues {
		cmds[i] = pipe.HMGet(ctx, TaskKey(q, id), "state", "msg")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return FoundJob{}, fmt.Errorf("look up job %q: %w", id, err)
	}
	for i, cmd := range cmds {
		v := cmd.Val()
		if len(v) != 2 {
			return FoundJob{}, fmt.Errorf("look up job %q in queue %q: HMGET replied %d values, want 2", id, queues[i], len(v))
		}
		if v[0] == nil {
			continue
		}
		st, ok := v[0].(string)
		if !ok || st == "" {
			return FoundJob{}, fmt.Errorf("look up job %q in queue %q: its state is %v", id, queues[i], v[0])
		}
		msg, ok := v[1].(string)
		if !ok && v[1] != nil {
			return FoundJob{}, fmt.Errorf("look up job %q in queue %q: its message is %T", id, queues[i], v[1])
		}
		return FoundJob{Queue: queues[i], State: st, Msg: msg}, nil
	}
	return FoundJob{}, nil
}

// Lookup returns, for each job (its ID in its queue), its state and message
// there ("" for a queue that does not hold it). One pipeline (on a Redis
// Cluster, one round trip per node).
func (j *Jobs) Lookup(ctx context.Context, jobs []Member) ([]FoundJob, error) {
	pipe := j.rc.Pipeline()
	cmds := make([]*redis.SliceCmd, len(jobs))
	for i, m := range jobs {
		cmds[i] = pipe.HMGet(ctx, TaskKey(m.Queue, m.ID), "state", "msg")
	}
	if len(jobs) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("look up %d jobs: %w", len(jobs), err)
		}
	}
	out := make([]FoundJob, len(jobs))
	for i, cmd := range cmds {
		v := cmd.Val()
		if len(v) != 2 || v[0] == nil {
			continue
		}
		st, _ := v[0].(string)
		msg, _ := v[1].(string)
		out[i] = FoundJob{Queue: jobs[i].Queue, State: st, Msg: msg}
	}
	return out, nil
}
