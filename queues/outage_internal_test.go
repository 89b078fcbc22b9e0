package queues

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// TestWhileRedisDownWaitsForRedis: a job that cannot reach Redis for its
// slot or its breaker keeps asking (instead of going back to asynq, which
// cannot write that either during an outage) until Redis answers, and stops
// asking when its context ends, its deadline comes near or the client stops.
func TestWhileRedisDownWaitsForRedis(t *testing.T) {
	t.Parallel()
	redisDown := fmt.Errorf("pool %q: %w: %w", "p", errGateRedis, errors.New("dial tcp: connection refused"))
	isGate := func(err error) bool { return errors.Is(err, errGateRedis) }

	t.Run("asks again until Redis answers", func(t *testing.T) {
		t.Parallel()
		r := &runner{}
		calls := 0
		began := time.Now()
		err := r.whileRedisDown(context.Background(), func() error {
			calls++
			if calls < 4 {
				return redisDown
			}
			return nil
		}, isGate)
		require.NoError(t, err)
		require.Equal(t, 4, calls)
		// 100 + 200 + 400 ms of pauses: it backs off, it does not spin.
		require.GreaterOrEqual(t, time.Since(began), 700*time.Millisecond)
	})
	t.Run("another error returns at once", func(t *testing.T) {
		t.Parallel()
		r := &runner{}
		calls := 0
		other := fmt.Errorf("pool %q: %w: deadline near", "p", errGateWait)
		err := r.whileRedisDown(context.Background(), func() error { calls++; return other }, isGate)
		require.ErrorIs(t, err, errGateWait)
		require.Equal(t, 1, calls)
	})
	t.Run("the job's context ends", func(t *testing.T) {
		t.Parallel()
		r := &runner{}
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		err := r.whileRedisDown(ctx, func() error {
			calls++
			if calls == 2 {
				cancel()
			}
			return redisDown
		}, isGate)
		require.ErrorIs(t, err, errGateRedis)
		require.Equal(t, 2, calls)
	})
	t.Run("the job's deadline comes near", func(t *testing.T) {
		t.Parallel()
		r := &runner{}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		began := time.Now()
		err := r.whileRedisDown(ctx, func() error { return redisDown }, isGate)
		require.ErrorIs(t, err, errGateRedis)
		took := time.Since(began)
		// It gives up before the deadline, leaving asynq time to requeue:
		// at the margin (200 ms), give or take a late timer on a busy
		// machine (half the margin).
		require.Less(t, took, 2*time.Second-gateGiveUpMargin(2*time.Second)/2)
		require.Greater(t, took, time.Second)
	})
	t.Run("the client stops", func(t *testing.T) {
		t.Parallel()
		r := &runner{}
		calls := 0
		err := r.whileRedisDown(context.Background(), func() error {
			calls++
			if calls == 3 {
				r.mu.Lock()
				r.stopping = true
				r.stopFlag.Store(true)
				r.mu.Unlock()
			}
			return redisDown
		}, isGate)
		require.ErrorIs(t, err, errGateRedis)
		require.Equal(t, 3, calls)
	})
}

// TestReleaseAfterAFailedCall: a job that ends after one of the gate's
// calls to Redis failed (an outage, a Sentinel failover) frees its slot and
// returns. Its release recovers first (re-adding the slots still held);
// when it held the renewal lock across that recovery, which takes the same
// lock, the job's handler never returned and the whole pool stalled.
func TestReleaseAfterAFailedCall(t *testing.T) {
	t.Parallel()
	g, r, cfg := plainGate(t, 2)
	ctx := context.Background()
	queue := g.conf.Load().pool.Queues()[0]
	a, err := g.acquire(ctx, "a", queue)
	require.NoError(t, err)
	b, err := g.acquire(ctx, "b", queue)
	require.NoError(t, err)
	g.failed(ctx) // a call to Redis failed meanwhile

	done := make(chan struct{})
	go func() {
		g.release(ctx, a)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("release blocked after a failed call to Redis")
	}
	leases := rdb.NewKeyspace(cfg.Namespace, false).Gate("p").Leases
	held, err := r.Client.ZRange(ctx, leases, 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{b}, held, "the released slot is free, the other still held")
	g.release(ctx, b)
}

// TestAcquireAgainKeepsTheSlot: a job whose call took its slot but whose
// reply was lost (a failover, a dropped connection) asks again: it gets
// the slot it holds, not a place behind its own lease, even in a pool of 1.
func TestAcquireAgainKeepsTheSlot(t *testing.T) {
	t.Parallel()
	g, r, cfg := plainGate(t, 1)
	ctx := context.Background()
	queue := g.conf.Load().pool.Queues()[0]
	a, err := g.acquire(ctx, "a", queue)
	require.NoError(t, err)
	g.mu.Lock()
	delete(g.held, a) // as if the reply had never arrived: the call failed
	g.mu.Unlock()
	g.failed(ctx)
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	again, err := g.acquire(short, "a", queue)
	require.NoError(t, err, "the job waited behind its own lease")
	require.Equal(t, a, again)
	leases := rdb.NewKeyspace(cfg.Namespace, false).Gate("p").Leases
	require.Equal(t, int64(1), r.Client.ZCard(ctx, leases).Val(), "one lease, not two")
	g.release(ctx, again)
}

// pingCounter counts PINGs and refuses them while down is set.
type pingCounter struct {
	down  atomic.Bool
	pings atomic.Int64
}

func (p *pingCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *pingCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "ping" {
			p.pings.Add(1)
			if p.down.Load() {
				err := errors.New("connect: connection refused")
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func (p *pingCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestAwaitRedisBeforeTheOutcome: what a job costs Redis before its
// outcome goes back to asynq. A short job while the health checks and its
// pool's gate see Redis answer: nothing. A job of a second or more: one
// check. Either, while Redis does not answer (check refused, the last
// health check or gate call failed): checks until it answers. (The check
// is a PING here, where the context names no queue; a job's reads its
// queue's key.)
func TestAwaitRedisBeforeTheOutcome(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T, healthDown, redisDown bool) (*runner, *pingCounter) {
		rdb := testredis.New(t).Connect()
		t.Cleanup(func() { _ = rdb.Close() })
		p := &pingCounter{}
		p.down.Store(redisDown)
		rdb.AddHook(p)
		h := &health{log: slog.New(slog.DiscardHandler)}
		if healthDown {
			h.report(errors.New("down"))
		}
		return &runner{c: &Client{rdb: rdb}, health: h}, p
	}
	ctx := context.Background()

	t.Run("short job, healthy", func(t *testing.T) {
		t.Parallel()
		r, p := setup(t, false, false)
		r.awaitRedis(ctx, outcomeCheckAfter-time.Millisecond, nil)
		g, _, _ := plainGate(t, 1)
		r.awaitRedis(ctx, outcomeCheckAfter-time.Millisecond, g)
		require.Zero(t, p.pings.Load())
	})
	t.Run("long job, healthy", func(t *testing.T) {
		t.Parallel()
		r, p := setup(t, false, false)
		r.awaitRedis(ctx, outcomeCheckAfter, nil)
		require.Equal(t, int64(1), p.pings.Load())
	})
	for _, c := range []struct {
		name       string
		ran        time.Duration
		healthDown bool
		gateFailed bool
	}{
		{"short job, health check failed", time.Millisecond, true, false},
		{"short job, the gate's last call failed", time.Millisecond, false, true},
		{"long job, PING refused", 2 * time.Second, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r, p := setup(t, c.healthDown, true)
			var g *gate
			if c.gateFailed {
				g, _, _ = plainGate(t, 1)
				g.failed(ctx)
			}
			hold, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			t.Cleanup(func() { cancel(); <-done })
			go func() {
				r.awaitRedis(hold, c.ran, g)
				close(done)
			}()
			testwait.For(t, 10*time.Second, "a few refused PINGs", func() bool { return p.pings.Load() >= 3 })
			select {
			case <-done:
				t.Fatal("the outcome went back while Redis did not answer")
			default:
			}
			p.down.Store(false)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("still holding after Redis answered")
			}
		})
	}
	t.Run("the job's deadline comes near", func(t *testing.T) {
		t.Parallel()
		r, p := setup(t, true, true)
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		r.awaitRedis(c, time.Millisecond, nil)
		require.NoError(t, c.Err(), "it held the job past its deadline")
		require.GreaterOrEqual(t, p.pings.Load(), int64(2), "it did not wait for Redis")
	})
}

// TestConfirmReadsTheFenceAfterTheJobsContextEnded: a run whose context
// ended (asynq gave up its lease after the process was stopped past it)
// as another process took it over is told it was taken (ErrFenced, logged
// and counted as fenced), not "could not tell", when Redis answers; with
// Redis gone it says it could not tell, within about a second.
func TestConfirmReadsTheFenceAfterTheJobsContextEnded(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	ks := rdb.NewKeyspace(r.Namespace(t), false)
	queue := ks.Queue("batch", "close")
	job := rdb.Member{ID: "report-1", Queue: queue}
	ended, cancel := context.WithCancel(context.Background())
	cancel()

	t.Run("Redis answers: fenced", func(t *testing.T) {
		f := newFences(r.Client, ks, time.Minute, slog.New(slog.DiscardHandler))
		_, a, untrack := f.track(context.Background(), job)
		defer untrack()
		a.began = time.Now().Add(-2 * time.Minute) // had it for longer than recover_after
		ctx := context.Background()
		now, err := r.Client.Time(ctx).Result()
		require.NoError(t, err)
		// Taken a minute ago, on Redis's clock (lua/recover_job.lua writes this).
		require.NoError(t, r.Client.ZAdd(ctx, ks.FencedKey(queue), redis.Z{Score: float64(now.Add(-time.Minute).UnixMilli()), Member: job.ID}).Err())
		require.ErrorIs(t, f.confirm(ended, a), ErrFenced)
		require.True(t, a.isFenced())
	})

	t.Run("Redis gone: could not tell", func(t *testing.T) {
		gone := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
		defer gone.Close()
		f := newFences(gone, ks, time.Minute, slog.New(slog.DiscardHandler))
		_, a, untrack := f.track(context.Background(), job)
		defer untrack()
		a.began = time.Now().Add(-2 * time.Minute)
		began := time.Now()
		err := f.confirm(ended, a)
		require.ErrorIs(t, err, errUnconfirmed)
		require.NotErrorIs(t, err, ErrFenced)
		require.Less(t, time.Since(began), 5*time.Second, "one bounded read, then it gives up")
	})
}
