package rdb

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// The runner counts a job's real failures itself, one key per job
// (Keyspace.FailureCountKey), so that a crash does not use up a retry and
// a breaker can give a failure back. In a pool with a breaker a job that
// has a count is also in the pool's counted set (Keyspace.breakerCountedKey),
// scored by when its count expires: while that set is empty no job of the
// pool has a count, and the runner deletes none.

//go:embed lua/breaker_count.lua
var breakerCountLua string

//go:embed lua/breaker_counted.lua
var breakerCountedLua string

var (
	breakerCountScript   = redis.NewScript(breakerCountLua)
	breakerCountedScript = redis.NewScript(breakerCountedLua)
)

// FailureCounts are the failure counts of one pool's jobs. The zero value
// is not usable; NewFailureCounts builds one without touching Redis.
type FailureCounts struct {
	rc   redis.UniversalClient
	ks   Keyspace
	pool string
}

// NewFailureCounts returns the failure counts of pool's jobs on rc.
func NewFailureCounts(rc redis.UniversalClient, ks Keyspace, pool string) FailureCounts {
	return FailureCounts{rc: rc, ks: ks, pool: pool}
}

func (f FailureCounts) key(job Member) string { return f.ks.FailureCountKey(job.Queue, job.ID) }

// Add counts one failure of job, a job of a pool without a breaker, and
// returns its count; the count lives ttl from now. One atomic step (MULTI:
// INCR, EXPIRE), one round trip.
func (f FailureCounts) Add(ctx context.Context, job Member, ttl time.Duration) (int64, error) {
	key := f.key(job)
	var n *redis.IntCmd
	_, err := f.rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
		n = p.Incr(ctx, key)
		p.Expire(ctx, key, ttl)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("count a failure of job %q: %w", job, err)
	}
	return n.Val(), nil
}

// AddCounted counts one failure of job, a job of a pool with a breaker,
// and returns its count (lua/breaker_count.lua): the job enters the pool's
// counted set before its count is made, and both live ttl from now.
func (f FailureCounts) AddCounted(ctx context.Context, job Member, ttl time.Duration) (int64, error) {
	keys := []string{f.key(job), f.ks.breakerCountedKey(f.pool)}
	n, err := breakerCountScript.Run(ctx, f.rc, keys, job.String(), ttl.Milliseconds()).Int64()
	if err != nil {
		return 0, fmt.Errorf("count a failure of job %q: %w", job, err)
	}
	return n, nil
}

// Get returns job's count, 0 when it has none.
func (f FailureCounts) Get(ctx context.Context, job Member) (int64, error) {
	n, err := f.rc.Get(ctx, f.key(job)).Int64()
	switch {
	case errors.Is(err, redis.Nil):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("read the failure count of job %q: %w", job, err)
	}
	return n, nil
}

// Delete deletes job's count (one DEL; the counted set is left as it is:
// for pools without a breaker).
func (f FailureCounts) Delete(ctx context.Context, job Member) error {
	if err := f.rc.Del(ctx, f.key(job)).Err(); err != nil {
		return fmt.Errorf("delete the failure count of job %q: %w", job, err)
	}
	return nil
}

// Clear deletes the counts of jobs and takes them out of the pool's
// counted set, the counts first, in one MULTI.
func (f FailureCounts) Clear(ctx context.Context, jobs ...Member) error {
	if len(jobs) == 0 {
		return nil
	}
	keys := make([]string, len(jobs))
	members := make([]any, len(jobs))
	for i, m := range jobs {
		keys[i], members[i] = f.key(m), m.String()
	}
	_, err := f.rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, keys...)
		p.ZRem(ctx, f.ks.breakerCountedKey(f.pool), members...)
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete the failure counts of %d jobs: %w", len(jobs), err)
	}
	return nil
}

// Counted returns how many of the pool's jobs have a count, after dropping
// the entries whose count has expired (lua/breaker_counted.lua).
func (f FailureCounts) Counted(ctx context.Context) (int64, error) {
	n, err := breakerCountedScript.Run(ctx, f.rc, []string{f.ks.breakerCountedKey(f.pool)}).Int64()
	if err != nil {
		return 0, fmt.Errorf("count the jobs of pool %q with a failure count: %w", f.pool, err)
	}
	return n, nil
}
