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
	f := newFencedStart(t, "run-fenced-start", "job-fenced-start", nil)
	f.takeOver(t, f.start(t))
	info := f.completed(t)
	require.Zero(t, info.Retried, "the fenced attempt recorded no failure")
	require.Empty(t, info.LastErr)
	require.EqualValues(t, 1, f.ran.Load())
	require.NotContains(t, f.logs.String(), "could not reach Redis for its run's record")
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
	f := newFencedStart(t, "run-fenced-probe", "job-fenced-probe", func(h *harness) {
		h.cfg.Pools[0].Breaker = &queues.BreakerConfig{CoolDown: time.Second}
		// The breaker's cool-down is over: the next job to start is its
		// probe. (Set in Redis: a job that tripped it would have its
		// failure given back and run again, perhaps as the probe.)
		state, _, _, _ := rdb.NewKeyspace(h.cfg.Namespace, false).BreakerKeys("order")
		require.NoError(t, h.redis.Client.HSet(ctx, state, "state", string(queues.BreakerHalfOpen), "probes_ok", 0).Err())
	})
	breaker := func() queues.BreakerState {
		st, err := f.c.Breaker(ctx, "order")
		require.NoError(t, err)
		return st
	}
	tried := f.start(t)
	st := breaker()
	require.Equal(t, queues.BreakerHalfOpen, st.State)
	require.Equal(t, 1, st.ProbesRunning)

	f.takeOver(t, tried)
	// The probe's place lapses 5 s after its last renewal
	// (breakerProbeTTL); the breaker then lets the job's new run probe.
	testwait.For(t, 30*time.Second, "the job's new run to probe and close the breaker", func() bool { return breaker().State == queues.BreakerClosed })
	require.Contains(t, breaker().Why, "1 of 1 probes succeeded")
	info := f.completed(t)
	require.EqualValues(t, 1, f.ran.Load(), "the handler ran once, in the new run")
	require.Zero(t, info.Retried)
}

// fencedStart is one order:create job of a run (takeOverHarness) whose
// process cannot record the run's start until takeOver: Redis refuses
// that call (refuseRunStart), and the runner keeps trying.
type fencedStart struct {
	h      *harness
	c      *queues.Client
	logs   apptest.SyncBuffer // the client's log, at info
	ran    atomic.Int64       // the handler's runs
	refuse *refuseRunStart
	queue  string // the job's queue, once started
}

// newFencedStart starts the client of a fencedStart for run and job id;
// before, if not nil, changes the harness first (its config, Redis).
func newFencedStart(t *testing.T, run, id string, before func(h *harness)) *fencedStart {
	t.Helper()
	f := &fencedStart{h: takeOverHarness(t), refuse: &refuseRunStart{run: run, id: id}}
	f.h.cfg.Logger = slog.New(slog.NewTextHandler(&f.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	mux := queues.NewHandlers()
	mux.HandleFunc("order:create", func(context.Context, *asynq.Task) error {
		f.ran.Add(1)
		return nil
	})
	f.refuse.down.Store(true)
	f.h.redis.Client.AddHook(f.refuse)
	if before != nil {
		before(f.h)
	}
	f.c = f.h.run(mux)
	return f
}

// start enqueues the job and returns once its first attempt tried to
// record the run's start.
func (f *fencedStart) start(t *testing.T) time.Time {
	t.Helper()
	_, res, err := f.h.client.EnqueueRun(context.Background(), queues.RunOptions{ID: f.refuse.run},
		[]queues.Request{{JobType: "order:create", Options: queues.EnqueueOptions{ID: f.refuse.id, Retention: time.Hour}}})
	require.NoError(t, err)
	f.queue = res[0].Queue
	testwait.For(t, 30*time.Second, "the job to try to record its start", func() bool { return f.refuse.refused.Load() > 0 })
	return time.Now()
}

// takeOver takes the job over from its process, once the process has had
// it for recover_after since tried (only such a job can have been taken
// from it), checks that the attempt ends as fenced without running the
// handler, and lets the run's start through again.
func (f *fencedStart) takeOver(t *testing.T, tried time.Time) {
	t.Helper()
	testwait.For(t, 30*time.Second, "the job to be recover_after old", func() bool { return time.Since(tried) >= queues.MinRecoverAfter })
	took, err := queues.TakeOver(f.c, "order", f.queue, f.refuse.id)
	require.NoError(t, err)
	require.True(t, took)
	testwait.For(t, 30*time.Second, "the first attempt to end as fenced", func() bool {
		return strings.Contains(f.logs.String(), `outcome="fenced:`)
	})
	require.Zero(t, f.ran.Load(), "the handler ran in the attempt that was taken over")
	f.refuse.down.Store(false)
}

// completed waits for the job's new run to complete it.
func (f *fencedStart) completed(t *testing.T) *asynq.TaskInfo {
	t.Helper()
	var info *asynq.TaskInfo
	testwait.For(t, 30*time.Second, "the job's new run to complete it", func() bool {
		var err error
		info, err = f.h.insp.GetTaskInfo(f.queue, f.refuse.id)
		return err == nil && info.State == asynq.TaskStateCompleted
	})
	return info
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
