package queues_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// A job whose process died (running in asynq's eyes, its lease renewed by
// nobody) goes back to its queue once its lease has gone unrenewed for
// RecoverAfter, not before, and runs once more, with no retry used up and
// the recovery reported.
func TestRecoversTheJobsOfADeadProcess(t *testing.T) {
	t.Parallel()
	pc := pool("order", 1, "order:create")
	pc.MaxRetry = queues.NoRetry
	h := newHarness(t, pc)
	recovered := make(chan queues.Recovery, 4)
	h.cfg.RecoverAfter = queues.MinRecoverAfter
	h.cfg.OnRecover = func(r queues.Recovery) { recovered <- r }
	res, err := h.client.Enqueue(context.Background(), "order:create", nil, queues.EnqueueOptions{Retention: time.Hour})
	require.NoError(t, err)
	require.NoError(t, queues.Abandon(h.client, res.Queue, res.ID))

	var mu sync.Mutex
	var runs []time.Time
	mux := queues.NewHandlers()
	mux.HandleFunc("order:create", func(ctx context.Context, _ *asynq.Task) error {
		mu.Lock()
		runs = append(runs, time.Now())
		mu.Unlock()
		return nil
	})
	started := time.Now()
	h.run(mux)
	var info *asynq.TaskInfo
	testwait.For(t, 30*time.Second, "the abandoned job to run and complete", func() bool {
		info, err = h.insp.GetTaskInfo(res.Queue, res.ID)
		return err == nil && info.State == asynq.TaskStateCompleted
	})
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, runs, 1, "it ran once")
	require.GreaterOrEqual(t, runs[0].Sub(started), queues.MinRecoverAfter-time.Second,
		"not taken before its lease went unrenewed for recover_after (asynq's lease is in whole seconds)")
	require.Zero(t, info.Retried, "no retry used up, although the pool allows none")
	select {
	case r := <-recovered:
		require.Equal(t, "order", r.Pool)
		require.Equal(t, []string{res.ID}, r.Jobs)
		require.GreaterOrEqual(t, r.Silent, queues.MinRecoverAfter)
	default:
		t.Fatal("the recovery was not reported (Config.OnRecover)")
	}
	t.Logf("recovered and run %s after the runner started watching (recover_after %s)", runs[0].Sub(started).Round(100*time.Millisecond), queues.MinRecoverAfter)
}

// A process whose running job another process took over (it stalled, or
// lost Redis, for longer than RecoverAfter) learns it within a second or
// so: the handler's context ends with ErrFenced, and nothing of that run is
// recorded: no failure (the pool allows no retry, so a recorded one would
// archive the job), no outcome; the job's new run completes it.
func TestATakenOverRunRecordsNothing(t *testing.T) {
	t.Parallel()
	h := takeOverHarness(t)
	var mu sync.Mutex
	attempts := 0
	firstBegan := make(chan time.Time, 1)
	cause := make(chan error, 1)
	mux := queues.NewHandlers()
	mux.HandleFunc("order:create", func(ctx context.Context, _ *asynq.Task) error {
		mu.Lock()
		attempts++
		n := attempts
		mu.Unlock()
		if n > 1 {
			return nil
		}
		firstBegan <- time.Now()
		<-ctx.Done() // a run that would go on and then fail
		cause <- context.Cause(ctx)
		return ctx.Err()
	})
	c := h.run(mux)
	res, err := h.client.Enqueue(context.Background(), "order:create", nil, queues.EnqueueOptions{Retention: time.Hour})
	require.NoError(t, err)
	began := <-firstBegan
	// Only a job a process has had for recover_after can have been taken
	// from it: wait until this one is that old, then take it as another
	// process's recovery would.
	testwait.For(t, 30*time.Second, "the run to be recover_after old", func() bool { return time.Since(began) >= queues.MinRecoverAfter })
	took, err := queues.TakeOver(c, "order", res.Queue, res.ID)
	require.NoError(t, err)
	require.True(t, took)
	takenAt := time.Now()
	select {
	case err := <-cause:
		require.ErrorIs(t, err, queues.ErrFenced)
		t.Logf("the first run's context ended %s after the take-over", time.Since(takenAt).Round(time.Millisecond))
		require.Less(t, time.Since(takenAt), 5*time.Second)
	case <-time.After(30 * time.Second):
		t.Fatal("the taken-over run's context did not end")
	}
	var info *asynq.TaskInfo
	testwait.For(t, 30*time.Second, "the job's new run to complete it", func() bool {
		info, err = h.insp.GetTaskInfo(res.Queue, res.ID)
		return err == nil && info.State == asynq.TaskStateCompleted
	})
	require.Zero(t, info.Retried, "the fenced run recorded no failure")
	require.Empty(t, info.LastErr)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 2, attempts)
}

// refuseRunStart refuses, while down is set, the call that records the
// start of job id of run, as an outage that reaches only that call would.
type refuseRunStart struct {
	run, id string
	down    atomic.Bool
	refused atomic.Int64
}

func (h *refuseRunStart) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *refuseRunStart) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// The start's arguments: the run, a retention, the job (lua/run_start.lua).
		args := cmd.Args()
		if i := slices.Index(args, any(h.run)); h.down.Load() && i >= 0 && i+2 < len(args) && args[i+2] == any(h.id) {
			h.refused.Add(1)
			err := errors.New("connect: connection refused")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *refuseRunStart) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestATakenOverJobStillRecordingItsStartIsFenced: a job of a run whose
// process could not record its start (Redis refused that call, and the
// runner kept trying) while another process took the job over ends as
// fenced: its handler never ran here, the log says it was taken over,
// nothing of that attempt is recorded, and the job's new run completes it.
// (Before, it ended as "could not reach Redis for its run's record", and
// the job's failure was written as if it had been its own.)
func TestATakenOverJobStillRecordingItsStartIsFenced(t *testing.T) {
	t.Parallel()
	h := takeOverHarness(t)
	var logs apptest.SyncBuffer
	h.cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ran := atomic.Int64{}
	mux := queues.NewHandlers()
	mux.HandleFunc("order:create", func(context.Context, *asynq.Task) error {
		ran.Add(1)
		return nil
	})
	refuse := &refuseRunStart{run: "run-fenced-start", id: "job-fenced-start"}
	refuse.down.Store(true)
	h.redis.Client.AddHook(refuse)
	c := h.run(mux)
	_, res, err := h.client.EnqueueRun(context.Background(), queues.RunOptions{ID: refuse.run},
		[]queues.Request{{JobType: "order:create", Options: queues.EnqueueOptions{ID: refuse.id, Retention: time.Hour}}})
	require.NoError(t, err)
	testwait.For(t, 30*time.Second, "the job to try to record its start", func() bool { return refuse.refused.Load() > 0 })
	tried := time.Now()
	// Only a job a process has had for recover_after can have been taken
	// from it.
	testwait.For(t, 30*time.Second, "the job to be recover_after old", func() bool { return time.Since(tried) >= queues.MinRecoverAfter })
	took, err := queues.TakeOver(c, "order", res[0].Queue, refuse.id)
	require.NoError(t, err)
	require.True(t, took)
	testwait.For(t, 30*time.Second, "the first attempt to end as fenced", func() bool {
		return strings.Contains(logs.String(), `outcome="fenced:`)
	})
	require.Zero(t, ran.Load(), "the handler ran in the attempt that was taken over")
	refuse.down.Store(false)
	var info *asynq.TaskInfo
	testwait.For(t, 30*time.Second, "the job's new run to complete it", func() bool {
		info, err = h.insp.GetTaskInfo(res[0].Queue, refuse.id)
		return err == nil && info.State == asynq.TaskStateCompleted
	})
	require.Zero(t, info.Retried, "the fenced attempt recorded no failure")
	require.Empty(t, info.LastErr)
	require.EqualValues(t, 1, ran.Load())
	require.NotContains(t, logs.String(), "could not reach Redis for its run's record")
}

// TestAFencedProbeGivesUpItsPlace: a job that became its pool's breaker
// probe and was taken over while it recorded its run's start ends fenced,
// and its process stops renewing the probe's place. While the place is
// held the breaker keeps the pool's queue paused (no room for another
// probe), so the job's new run waits there until the place frees, once
// its lease lapses; then it probes, closes the breaker and completes. A
// process that kept renewing the fenced probe's place would hold the
// breaker half-open with no room for a probe, and every job of the pool
// would wait for good.
func TestAFencedProbeGivesUpItsPlace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := takeOverHarness(t)
	h.cfg.Pools[0].Breaker = &queues.BreakerConfig{CoolDown: time.Second}
	var logs apptest.SyncBuffer
	h.cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ran := atomic.Int64{}
	mux := queues.NewHandlers()
	mux.HandleFunc("order:create", func(context.Context, *asynq.Task) error {
		ran.Add(1)
		return nil
	})
	refuse := &refuseRunStart{run: "run-fenced-probe", id: "job-fenced-probe"}
	refuse.down.Store(true)
	h.redis.Client.AddHook(refuse)
	// The breaker's cool-down is over: the next job to start is its
	// probe. (Set in Redis: a job that tripped it would have its failure
	// given back and run again, perhaps as the probe.)
	state, _, _, _ := rdb.NewKeyspace(h.cfg.Namespace, false).BreakerKeys("order")
	require.NoError(t, h.redis.Client.HSet(ctx, state, "state", string(queues.BreakerHalfOpen), "probes_ok", 0).Err())
	c := h.run(mux)
	breaker := func() queues.BreakerState {
		st, err := c.Breaker(ctx, "order")
		require.NoError(t, err)
		return st
	}
	_, res, err := h.client.EnqueueRun(ctx, queues.RunOptions{ID: refuse.run},
		[]queues.Request{{JobType: "order:create", Options: queues.EnqueueOptions{ID: refuse.id, Retention: time.Hour}}})
	require.NoError(t, err)
	testwait.For(t, 30*time.Second, "the probe to try to record its start", func() bool { return refuse.refused.Load() > 0 })
	tried := time.Now()
	st := breaker()
	require.Equal(t, queues.BreakerHalfOpen, st.State)
	require.Equal(t, 1, st.ProbesRunning)

	testwait.For(t, 30*time.Second, "the job to be recover_after old", func() bool { return time.Since(tried) >= queues.MinRecoverAfter })
	took, err := queues.TakeOver(c, "order", res[0].Queue, refuse.id)
	require.NoError(t, err)
	require.True(t, took)
	testwait.For(t, 30*time.Second, "the probe to end as fenced", func() bool {
		return strings.Contains(logs.String(), `outcome="fenced:`)
	})
	require.Zero(t, ran.Load(), "the handler ran in the attempt that was taken over")
	refuse.down.Store(false)
	// The probe's place lapses 5 s after its last renewal
	// (breakerProbeTTL); the breaker then lets the job's new run probe.
	testwait.For(t, 30*time.Second, "the job's new run to probe and close the breaker", func() bool { return breaker().State == queues.BreakerClosed })
	require.Contains(t, breaker().Why, "1 of 1 probes succeeded")
	var info *asynq.TaskInfo
	testwait.For(t, 30*time.Second, "the job's new run to complete it", func() bool {
		info, err = h.insp.GetTaskInfo(res[0].Queue, refuse.id)
		return err == nil && info.State == asynq.TaskStateCompleted
	})
	require.EqualValues(t, 1, ran.Load(), "the handler ran once, in the new run")
	require.Zero(t, info.Retried)
}

// takeOverHarness is a harness whose order:create jobs another process
// may take over (TakeOver) once a process has had them for
// MinRecoverAfter: a pool of 1 with no retries, so that a failure recorded
// for a run taken over would archive its job. The pool is process-scoped:
// in a cluster-scoped one the take-over also needs the stalled process's
// slot lease to have lapsed, which a process that is not stalled keeps
// renewing.
func takeOverHarness(t *testing.T) *harness {
	t.Helper()
	pc := pool("order", 1, "order:create")
	pc.MaxRetry, pc.Scope = queues.NoRetry, queues.ScopeProcess
	h := newHarness(t, pc)
	h.cfg.RecoverAfter = queues.MinRecoverAfter
	return h
}
