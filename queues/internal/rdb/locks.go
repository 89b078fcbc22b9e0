package rdb

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The enqueue locks of unique job IDs: while a job with an ID is looked up
// and enqueued in its pool, the ID's lock (enqueueLockKey) holds the
// enqueuing call's token, so that two clients cannot both find it absent.

//go:embed lua/enqueue_lock_find.lua
var lockFindLua string

//go:embed lua/enqueue_unlock.lua
var unlockLua string

var (
	lockFindScript = redis.NewScript(lockFindLua)
	unlockScript   = redis.NewScript(unlockLua)
)

// lockChunk bounds the keys and arguments of one call of the lock
// scripts: a batch's locks take as many calls as they need.
const lockChunk = 2000

// LockJob is a job whose ID is locked while it is looked up and enqueued.
type LockJob struct {
	Pool, ID string
	// Queues are the pool's queues, highest tier first: where the job is
	// looked for.
	Queues []string
	// Breaker says the pool has a circuit breaker: when the job is in
	// none of its queues, failure counts left under its ID (a finished
	// run's) are deleted, so that the new run does not inherit them.
	Breaker bool
}

// Lookup is what LockAndFind did for one job.
type Lookup struct {
	// Locked: another client holds the job's lock. It was not taken and
	// nothing was looked up; ask again.
	Locked bool
	// Queue is the first of the job's queues that holds it, "" when none
	// does (the job is new), and State its asynq state there.
	Queue, State string
}

// LockAndFind takes the enqueue lock of each job for ttl, holding token,
// and for each lock taken looks the job up in its queues. The calls are
// chunked (each of at most about two thousand keys and arguments); on a
// Redis Cluster the jobs must be one pool's, whose keys share a slot.
//
// On an error some of the locks may have been taken: Unlock all of jobs
// (it releases only those holding token).
func (j *Jobs) LockAndFind(ctx context.Context, token string, ttl time.Duration, jobs []LockJob) ([]Lookup, error) {
	if err := j.onePool(jobs); err != nil {
		return nil, fmt.Errorf("enqueue locks: %w", err)
	}
	out := make([]Lookup, 0, len(jobs))
	for start := 0; start < len(jobs); {
		var keys []string
		args := []any{ttl.Milliseconds(), token}
		end := start
		for ; end < len(jobs) && len(keys)+len(args) < lockChunk; end++ {
			job := jobs[end]
			keys = append(keys, j.ks.enqueueLockKey(job.Pool, job.ID))
			for _, q := range job.Queues {
				keys = append(keys, TaskKey(q, job.ID))
			}
			if !job.Breaker {
				args = append(args, len(job.Queues), 0)
				continue
			}
			args = append(args, len(job.Queues), len(job.Queues))
			keys = append(keys, j.ks.breakerCountedKey(job.Pool))
			for _, q := range job.Queues {
				keys = append(keys, j.ks.FailureCountKey(q, job.ID))
				args = append(args, Member{ID: job.ID, Queue: q}.String())
			}
		}
		res, err := lockFindScript.Run(ctx, j.rc, keys, args...).StringSlice()
		if err != nil {
			return nil, fmt.Errorf("enqueue locks: %w", err)
		}
		if len(res) != end-start {
			return nil, fmt.Errorf("enqueue locks: %d replies for %d jobs", len(res), end-start)
		}
		for n, r := range res {
			job := jobs[start+n]
			switch r {
			case "locked":
				out = append(out, Lookup{Locked: true})
			case "new":
				out = append(out, Lookup{})
			default:
				pos, state, _ := strings.Cut(r, ":")
				k, err := strconv.Atoi(pos)
				if err != nil || k < 1 || k > len(job.Queues) || state == "" {
					return nil, fmt.Errorf("enqueue locks: job %q: reply %q", job.ID, r)
				}
				out = append(out, Lookup{Queue: job.Queues[k-1], State: state})
			}
		}
		start = end
	}
	return out, nil
}

// Unlock releases the enqueue locks of jobs that hold token, and returns
// how many it released: a lock that expired, and maybe another client's
// now, stays. It tries every chunk and returns the first error; on a
// Redis Cluster the jobs must be one pool's.
func (j *Jobs) Unlock(ctx context.Context, token string, jobs []LockJob) (int, error) {
	if err := j.onePool(jobs); err != nil {
		return 0, fmt.Errorf("release enqueue locks: %w", err)
	}
	released := 0
	var first error
	for start := 0; start < len(jobs); start += lockChunk {
		chunk := jobs[start:min(len(jobs), start+lockChunk)]
		keys := make([]string, len(chunk))
		for k, job := range chunk {
			keys[k] = j.ks.enqueueLockKey(job.Pool, job.ID)
		}
		n, err := unlockScript.Run(ctx, j.rc, keys, token).Int()
		if err != nil {
			if first == nil {
				first = fmt.Errorf("release %d enqueue locks: %w", len(chunk), err)
			}
			continue
		}
		released += n
	}
	return released, first
}

// onePool checks that, on a Redis Cluster, jobs are one pool's.
func (j *Jobs) onePool(jobs []LockJob) error {
	if !j.ks.cluster {
		return nil
	}
	for _, job := range jobs[min(1, len(jobs)):] {
		if job.Pool != jobs[0].Pool {
			return fmt.Errorf("on a Redis Cluster one call takes one pool's jobs, got pools %q and %q", jobs[0].Pool, job.Pool)
		}
	}
	return nil
}
