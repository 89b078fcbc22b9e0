package rdb

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
)

// recoveryCase is one running job "j" of pool "p" (tier "hi"), as asynq
// leaves it in Redis when its process dies: in the active list, with a
// lease, its state active; two jobs wait behind it.
type recoveryCase struct {
	t     *testing.T
	b     backend
	ctx   context.Context
	queue string
	job   Member
}

const recoverySeen = 1700000000 // a lease expiry nobody renews

func newRecoveryCase(t *testing.T, b backend) *recoveryCase {
	c := &recoveryCase{t: t, b: b, ctx: context.Background(), queue: b.KS.Queue("p", "hi")}
	c.job = Member{ID: "j", Queue: c.queue}
	rc := b.RC
	require.NoError(t, rc.LPush(c.ctx, PendingKey(c.queue), "a", "b").Err()) // "a" is next
	require.NoError(t, rc.LPush(c.ctx, ActiveKey(c.queue), "j").Err())
	require.NoError(t, rc.ZAdd(c.ctx, LeaseKey(c.queue), redisZ(recoverySeen, "j")).Err())
	require.NoError(t, rc.HSet(c.ctx, TaskKey(c.queue, "j"), "state", "active", "retried", "2").Err())
	return c
}

func (c *recoveryCase) recover(gated bool) Recovery {
	c.t.Helper()
	var place *RecoverPlace
	if gated {
		place = &RecoverPlace{Rank: 1, Keep: 2 * time.Minute}
	}
	r, err := c.b.KS.RecoverJob(c.ctx, c.b.RC, c.job, recoverySeen, "p", place, time.Hour)
	require.NoError(c.t, err)
	return r
}

// untouched checks that the job is still running as it was.
func (c *recoveryCase) untouched() {
	c.t.Helper()
	rc := c.b.RC
	require.Equal(c.t, []string{"j"}, rc.LRange(c.ctx, ActiveKey(c.queue), 0, -1).Val())
	require.Equal(c.t, []string{"b", "a"}, rc.LRange(c.ctx, PendingKey(c.queue), 0, -1).Val())
	require.Equal(c.t, "active", rc.HGet(c.ctx, TaskKey(c.queue, "j"), "state").Val())
	require.Zero(c.t, rc.Exists(c.ctx, c.b.KS.FencedKey(c.queue)).Val())
}

// slot gives the job a cluster-wide slot lease expiring at ms, held by
// "proc-1".
func (c *recoveryCase) slot(ms int64) {
	g := c.b.KS.Gate("p")
	require.NoError(c.t, c.b.RC.ZAdd(c.ctx, g.Leases, redisZ(float64(ms), c.job.String())).Err())
	require.NoError(c.t, c.b.RC.HSet(c.ctx, g.Holders, c.job.String(), "proc-1").Err())
}

func (c *recoveryCase) redisNowMs() int64 {
	now, err := c.b.RC.Time(c.ctx).Result()
	require.NoError(c.t, err)
	return now.UnixMilli()
}

func init() {
	scriptCases = append(scriptCases,
		scriptCase{script: "recover_job", name: "a job whose lease nobody renewed goes back next in line once, without using a retry, and is fenced", run: func(t *testing.T, b backend) {
			c := newRecoveryCase(t, b)
			before := c.redisNowMs()
			r := c.recover(false)
			require.Equal(t, Recovered, r.Outcome)
			require.GreaterOrEqual(t, r.At, before)
			rc := b.RC
			require.Empty(t, rc.LRange(c.ctx, ActiveKey(c.queue), 0, -1).Val())
			require.Zero(t, rc.ZCard(c.ctx, LeaseKey(c.queue)).Val())
			require.Equal(t, "j", rc.RPop(c.ctx, PendingKey(c.queue)).Val(), "asynq dequeues from the right: the job is next")
			require.Equal(t, "pending", rc.HGet(c.ctx, TaskKey(c.queue, "j"), "state").Val())
			require.Equal(t, "2", rc.HGet(c.ctx, TaskKey(c.queue, "j"), "retried").Val(), "no retry used up")
			require.Equal(t, float64(r.At), rc.ZScore(c.ctx, b.KS.FencedKey(c.queue), "j").Val())
			require.Positive(t, rc.PTTL(c.ctx, b.KS.FencedKey(c.queue)).Val())
			// A second recovery (another process, at the same time) finds
			// nothing to do.
			require.Equal(t, NotRecovered, c.recover(false).Outcome)
		}},
		scriptCase{script: "recover_job", name: "a lease that moved, or a job no longer active, is left alone", run: func(t *testing.T, b backend) {
			c := newRecoveryCase(t, b)
			require.NoError(t, b.RC.ZAdd(c.ctx, LeaseKey(c.queue), redisZ(recoverySeen+5, "j")).Err()) // renewed
			require.Equal(t, NotRecovered, c.recover(false).Outcome)
			c.untouched()
			// asynq's recoverer took it first: active no more.
			require.NoError(t, b.RC.ZAdd(c.ctx, LeaseKey(c.queue), redisZ(recoverySeen, "j")).Err())
			require.NoError(t, b.RC.LRem(c.ctx, ActiveKey(c.queue), 0, "j").Err())
			require.Equal(t, NotRecovered, c.recover(false).Outcome)
			require.Equal(t, []string{"b", "a"}, b.RC.LRange(c.ctx, PendingKey(c.queue), 0, -1).Val())
		}},
		scriptCase{script: "recover_job", name: "in a cluster-scoped pool a live slot lease holds the job; a lapsed one is kept for it", run: func(t *testing.T, b backend) {
			c := newRecoveryCase(t, b)
			c.slot(c.redisNowMs() + time.Hour.Milliseconds())
			require.Equal(t, SlotStillHeld, c.recover(true).Outcome)
			c.untouched()
			c.slot(c.redisNowMs() - 1000)
			before := c.redisNowMs()
			r := c.recover(true)
			require.Equal(t, Recovered, r.Outcome)
			require.Equal(t, "proc-1", r.Holder)
			g := b.KS.Gate("p")
			// The slot is the job's again, kept for it (no waiter can take
			// it) for keptFor, until it is dequeued and asks.
			require.Equal(t, map[string]string{c.job.String(): keptHolder}, b.RC.HGetAll(c.ctx, g.Holders).Val())
			exp := b.RC.ZScore(c.ctx, g.Leases, c.job.String()).Val()
			require.GreaterOrEqual(t, exp, float64(before+keptFor.Milliseconds()))
			require.LessOrEqual(t, exp, float64(c.redisNowMs()+keptFor.Milliseconds()))
			// The place kept for it in the waiting line: ahead of any job
			// of its tier that asked (rank x 1e13 + when, ms), outside
			// the line itself until it asks.
			place, err := b.RC.HGet(c.ctx, g.Places, c.job.String()).Float64()
			require.NoError(t, err)
			require.Equal(t, float64(1e13+recoverySeen), place)
			require.Less(t, place, float64(1e13+c.redisNowMs()-60_000), "ahead of a job that asked a minute ago")
			require.Zero(t, b.RC.ZCard(c.ctx, g.Waiting).Val(), "no waiter entry: it counts for no pause")
			require.InDelta(t, (2 * time.Minute).Milliseconds(), b.RC.PTTL(c.ctx, g.Places).Val().Milliseconds(), 2000)
		}},
		scriptCase{script: "recover_job", name: "a pause the gate set on the job's queue is lifted, an operator's stays", run: func(t *testing.T, b backend) {
			c := newRecoveryCase(t, b)
			require.NoError(t, b.RC.Set(c.ctx, PausedKey(c.queue), GatePause, 0).Err())
			require.Equal(t, Recovered, c.recover(true).Outcome)
			require.Zero(t, b.RC.Exists(c.ctx, PausedKey(c.queue)).Val())
			c = newRecoveryCase(t, backend{RC: b.RC, KS: NewKeyspace(freshNamespace(), b.KS.Cluster()), Redis: b.Redis})
			require.NoError(t, b.RC.Set(c.ctx, PausedKey(c.queue), "1700000000", 0).Err())
			require.Equal(t, Recovered, c.recover(true).Outcome)
			require.Equal(t, "1700000000", b.RC.Get(c.ctx, PausedKey(c.queue)).Val())
			b.RC.Del(c.ctx, PausedKey(c.queue))
		}},
		scriptCase{script: "recover_job", name: "a job held ahead of a slot gets a place behind the running ones, ahead of any that asked", run: func(t *testing.T, b backend) {
			c := newRecoveryCase(t, b)
			g := b.KS.Gate("p")
			require.NoError(t, b.RC.ZAdd(c.ctx, g.Waiting, redisZ(1e13+float64(c.redisNowMs()-20_000), c.job.String())).Err())
			require.Equal(t, Recovered, c.recover(true).Outcome)
			place, err := b.RC.HGet(c.ctx, g.Places, c.job.String()).Float64()
			require.NoError(t, err)
			require.Equal(t, float64(1e13+recoverySeen+1e9), place)
			require.Less(t, place, 1e13+float64(c.redisNowMs()-60_000))
		}},
		scriptCase{script: "recover_job", name: "a job no longer active keeps its lapsed slot as it was", run: func(t *testing.T, b backend) {
			c := newRecoveryCase(t, b)
			c.slot(c.redisNowMs() - 1000)
			g := b.KS.Gate("p")
			before := b.RC.ZScore(c.ctx, g.Leases, c.job.String()).Val()
			require.NoError(t, b.RC.LRem(c.ctx, ActiveKey(c.queue), 0, "j").Err())
			require.Equal(t, NotRecovered, c.recover(true).Outcome)
			require.Equal(t, before, b.RC.ZScore(c.ctx, g.Leases, c.job.String()).Val())
			require.Equal(t, "proc-1", b.RC.HGet(c.ctx, g.Holders, c.job.String()).Val())
			require.Zero(t, b.RC.Exists(c.ctx, g.Places).Val())
		}},
		scriptCase{script: "fence_read", name: "says how long ago each taken job was taken, on Redis's clock, and nothing of the others", run: func(t *testing.T, b backend) {
			c := newRecoveryCase(t, b)
			ages, err := b.KS.FenceAges(c.ctx, b.RC, c.queue, []string{"j", "k"})
			require.NoError(t, err)
			require.Empty(t, ages)
			require.Equal(t, Recovered, c.recover(false).Outcome)
			ages, err = b.KS.FenceAges(c.ctx, b.RC, c.queue, []string{"j", "k"})
			require.NoError(t, err)
			require.Len(t, ages, 1)
			require.GreaterOrEqual(t, ages["j"], time.Duration(0))
			require.Less(t, ages["j"], 5*time.Second)
		}},
	)
}

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }

// The guarded client asks before asynq's writes that name a job's task
// key, on both layouts, and a refusal keeps the command from Redis.
func TestGuardedClient(t *testing.T) {
	r := testredis.New(t)
	ctx := context.Background()
	for _, cluster := range []bool{false, true} {
		ks := NewKeyspace(r.Namespace(t), cluster)
		queue := ks.Queue("p", "hi")
		job := Member{ID: "j:1}:t:x", Queue: queue}
		m, ok := parseTaskKey(TaskKey(queue, job.ID))
		require.True(t, ok)
		require.Equal(t, job, m)
		var asked [][]Member
		refuse := errors.New("refused")
		c := GuardedClient{UniversalClient: r.Client, Guard: func(_ context.Context, jobs []Member) error {
			asked = append(asked, jobs)
			return refuse
		}}
		require.ErrorIs(t, c.HSet(ctx, TaskKey(queue, job.ID), "result", "x").Err(), refuse)
		require.ErrorIs(t, c.Eval(ctx, "return redis.call('HSET', KEYS[1], 'a', 1)", []string{ActiveKey(queue), TaskKey(queue, job.ID)}).Err(), refuse)
		require.Zero(t, r.Client.Exists(ctx, TaskKey(queue, job.ID)).Val(), "a refused command never reaches Redis")
		require.Equal(t, [][]Member{{job}, {job}}, asked)
		// Commands that name no job's task go through unasked.
		require.NoError(t, c.HSet(ctx, ActiveKey(queue)+":other", "a", 1).Err())
		require.NoError(t, c.Eval(ctx, "return 1", []string{PendingKey(queue)}).Err())
		require.Len(t, asked, 2)
		r.Client.Del(ctx, ActiveKey(queue)+":other")
	}
}

func init() {
	scriptCases = append(scriptCases,
		scriptCase{script: "leases_unrenewed", name: "lists the running jobs whose lease went unrenewed for the time asked, with how long", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			hi, lo := b.KS.Queue("p", "hi"), b.KS.Queue("p", "lo")
			now := time.Now()
			lease := func(q, id string, renewedAgo time.Duration) {
				require.NoError(t, b.RC.ZAdd(ctx, LeaseKey(q), redisZ(float64(now.Add(-renewedAgo).Add(30*time.Second).Unix()), id)).Err())
			}
			lease(hi, "fresh", time.Second)
			lease(hi, "silent", 10*time.Second)
			lease(lo, "older", 20*time.Second)
			batch := NewPools(b.RC, b.KS).Batch()
			read := batch.Unrenewed([]string{hi, lo}, 7*time.Second)
			require.NoError(t, batch.Exec(ctx))
			got, err := read.Result()
			require.NoError(t, err)
			require.Len(t, got, 2)
			require.Equal(t, []string{hi, lo}, []string{got[0].Queue, got[1].Queue})
			require.Equal(t, []string{"silent", "older"}, []string{got[0].ID, got[1].ID})
			require.InDelta(t, 10, got[0].Silent.Seconds(), 1.5, "whole seconds")
			require.InDelta(t, 20, got[1].Silent.Seconds(), 1.5)
		}},
	)
}
