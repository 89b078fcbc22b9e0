package rdb

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// failuresCase is the failure counts of pool "p" (tiers "hi" and "lo").
type failuresCase struct {
	t          *testing.T
	b          backend
	fc         FailureCounts
	queues     []string
	countedKey string
	ctx        context.Context
}

func newFailuresCase(t *testing.T, b backend) *failuresCase {
	return &failuresCase{t: t, b: b, fc: NewFailureCounts(b.RC, b.KS, "p"),
		queues: []string{b.KS.Queue("p", "hi"), b.KS.Queue("p", "lo")}, countedKey: b.KS.breakerCountedKey("p"), ctx: context.Background()}
}

func (c *failuresCase) key(m Member) string { return c.b.KS.FailureCountKey(m.Queue, m.ID) }

// ttl returns key's time to live.
func (c *failuresCase) ttl(key string) time.Duration {
	c.t.Helper()
	d, err := c.b.RC.PTTL(c.ctx, key).Result()
	require.NoError(c.t, err)
	return d
}

func (c *failuresCase) counted() []redis.Z {
	c.t.Helper()
	z, err := c.b.RC.ZRangeWithScores(c.ctx, c.countedKey, 0, -1).Result()
	require.NoError(c.t, err)
	return z
}

func init() {
	scriptCases = append(scriptCases,
		scriptCase{script: "failure_counts", name: "add counts and sets the count's lifetime in one step", run: func(t *testing.T, b backend) {
			c := newFailuresCase(t, b)
			job := Member{ID: "j@1", Queue: c.queues[0]}
			for want := int64(1); want <= 2; want++ {
				n, err := c.fc.Add(c.ctx, job, time.Hour)
				require.NoError(t, err)
				require.Equal(t, want, n)
				require.InDelta(t, time.Hour.Seconds(), c.ttl(c.key(job)).Seconds(), 2)
			}
			n, err := c.fc.Get(c.ctx, job)
			require.NoError(t, err)
			require.EqualValues(t, 2, n)
			require.Empty(t, c.counted(), "a pool without a breaker has no counted set")
		}},
		scriptCase{script: "failure_counts", name: "get reads 0 for a job without a count; delete removes it", run: func(t *testing.T, b backend) {
			c := newFailuresCase(t, b)
			job := Member{ID: "j", Queue: c.queues[1]}
			n, err := c.fc.Get(c.ctx, job)
			require.NoError(t, err)
			require.Zero(t, n)
			require.NoError(t, b.RC.Set(c.ctx, c.key(job), 3, time.Hour).Err())
			require.NoError(t, c.fc.Delete(c.ctx, job))
			require.Equal(t, time.Duration(-2), c.ttl(c.key(job)), "gone")
			require.NoError(t, c.fc.Delete(c.ctx, job), "deleting nothing is no error")
		}},
		scriptCase{script: "failure_counts", name: "a count that is not a number is an error", run: func(t *testing.T, b backend) {
			c := newFailuresCase(t, b)
			job := Member{ID: "j", Queue: c.queues[0]}
			require.NoError(t, b.RC.Set(c.ctx, c.key(job), "many", time.Hour).Err())
			_, err := c.fc.Get(c.ctx, job)
			require.ErrorContains(t, err, `read the failure count of job "j@`+c.queues[0]+`"`)
		}},
		scriptCase{script: "failure_counts", name: "clear deletes counts and takes the jobs out of the counted set", run: func(t *testing.T, b backend) {
			c := newFailuresCase(t, b)
			a, k, other := Member{ID: "a", Queue: c.queues[0]}, Member{ID: "k", Queue: c.queues[1]}, Member{ID: "o", Queue: c.queues[0]}
			for _, m := range []Member{a, k, other} {
				_, err := c.fc.AddCounted(c.ctx, m, time.Hour)
				require.NoError(t, err)
			}
			require.NoError(t, c.fc.Clear(c.ctx, a, k))
			for _, m := range []Member{a, k} {
				require.Equal(t, time.Duration(-2), c.ttl(c.key(m)))
			}
			z := c.counted()
			require.Len(t, z, 1)
			require.Equal(t, other.String(), z[0].Member)
			require.NoError(t, c.fc.Clear(c.ctx), "no jobs: no call")
		}},

		scriptCase{script: "breaker_count", name: "enters the job in the counted set and counts, both with the lifetime", run: func(t *testing.T, b backend) {
			c := newFailuresCase(t, b)
			job := Member{ID: "j", Queue: c.queues[1]}
			now, err := b.RC.Time(c.ctx).Result()
			require.NoError(t, err)
			for want := int64(1); want <= 2; want++ {
				n, err := c.fc.AddCounted(c.ctx, job, time.Hour)
				require.NoError(t, err)
				require.Equal(t, want, n)
			}
			require.Equal(t, "2", b.RC.Get(c.ctx, c.key(job)).Val())
			require.InDelta(t, time.Hour.Seconds(), c.ttl(c.key(job)).Seconds(), 2)
			require.InDelta(t, time.Hour.Seconds(), c.ttl(c.countedKey).Seconds(), 2)
			z := c.counted()
			require.Len(t, z, 1)
			require.Equal(t, job.String(), z[0].Member)
			require.InDelta(t, float64(now.Add(time.Hour).UnixMilli()), z[0].Score, 2000, "scored by when the count expires")
		}},

		scriptCase{script: "breaker_counted", name: "counts the jobs whose count has not expired, dropping the others", run: func(t *testing.T, b backend) {
			c := newFailuresCase(t, b)
			n, err := c.fc.Counted(c.ctx)
			require.NoError(t, err)
			require.Zero(t, n)
			now, err := b.RC.Time(c.ctx).Result()
			require.NoError(t, err)
			require.NoError(t, b.RC.ZAdd(c.ctx, c.countedKey,
				redis.Z{Score: float64(now.Add(time.Hour).UnixMilli()), Member: "live@" + c.queues[0]},
				redis.Z{Score: float64(now.Add(-time.Second).UnixMilli()), Member: "expired@" + c.queues[0]}).Err())
			n, err = c.fc.Counted(c.ctx)
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			z := c.counted()
			require.Len(t, z, 1)
			require.Equal(t, "live@"+c.queues[0], z[0].Member)
		}},
	)
}
