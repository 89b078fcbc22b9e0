package queues_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// A job that runs into its deadline counts against max_retry: the handler's
// context ends before asynq's deadline, so the count is in and the verdict
// reaches asynq, which would otherwise retry at once without reading it.
// With NoRetry it runs once and is archived, with the count and the
// deadline in its reason.
func TestTimeoutsCountAgainstMaxRetry(t *testing.T) {
	t.Parallel()
	pc := pool("order", 1, "order:create")
	// 10 s leaves the runner 1 s between the handler's deadline and
	// asynq's to count the failure: 300 ms (a 3 s timeout) was missed on
	// a 2-core machine loaded far past its cores.
	pc.MaxRetry, pc.JobTimeout = queues.NoRetry, 10*time.Second
	h := newHarness(t, pc)
	var mu sync.Mutex
	runs := 0
	mux := queues.NewHandlers()
	mux.HandleFunc("order:create", func(ctx context.Context, _ *asynq.Task) error {
		mu.Lock()
		runs++
		mu.Unlock()
		<-ctx.Done() // a query that hangs until the deadline
		return ctx.Err()
	})
	h.cfg.RetryDelay = func(int, error) time.Duration { return 10 * time.Millisecond }
	h.cfg.DelayedCheckInterval = 50 * time.Millisecond
	h.run(mux)
	res, err := h.client.Enqueue(context.Background(), "order:create", nil, queues.EnqueueOptions{Retention: time.Hour})
	require.NoError(t, err)
	var info *asynq.TaskInfo
	testwait.For(t, 30*time.Second, "the job to be archived", func() bool {
		info, err = h.insp.GetTaskInfo(res.Queue, res.ID)
		return err == nil && info.State == asynq.TaskStateArchived
	})
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, runs, "NoRetry: the job ran once")
	require.Contains(t, info.LastErr, "failed more times than max_retry allows (1 failure, max_retry 0): ran into its deadline (job_timeout 10s): context deadline exceeded")
}

// The same job ID in two pools counts its failures apart.
func TestFailureCountsPerPool(t *testing.T) {
	t.Parallel()
	a, b := pool("a", 1, "a:job"), pool("b", 1, "b:job")
	a.MaxRetry, b.MaxRetry = 1, 1
	h := newHarness(t, a, b)
	var mu sync.Mutex
	runs := map[string]int{}
	mux := queues.NewHandlers()
	for _, jt := range []string{"a:job", "b:job"} {
		mux.HandleFunc(jt, func(ctx context.Context, task *asynq.Task) error {
			mu.Lock()
			runs[task.Type()]++
			mu.Unlock()
			return errors.New("always fails")
		})
	}
	h.cfg.RetryDelay = func(int, error) time.Duration { return 10 * time.Millisecond }
	h.cfg.DelayedCheckInterval = 50 * time.Millisecond
	h.run(mux)
	ctx := context.Background()
	var results []queues.EnqueueResult
	for _, jt := range []string{"a:job", "b:job"} {
		res, err := h.client.Enqueue(ctx, jt, nil, queues.EnqueueOptions{ID: "same", Retention: time.Hour})
		require.NoError(t, err)
		results = append(results, res)
	}
	testwait.For(t, 30*time.Second, "both jobs to be archived", func() bool {
		for _, res := range results {
			info, err := h.insp.GetTaskInfo(res.Queue, res.ID)
			if err != nil || info.State != asynq.TaskStateArchived {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{"a:job": 2, "b:job": 2}, runs, "1 run + max_retry 1, in each pool")
}

// A pause the gate left on a queue is lifted when the pool starts without
// a gate (its scope changed to process), so its jobs run.
func TestScopeChangeLiftsTheGatesPause(t *testing.T) {
	t.Parallel()
	pc := pool("order", 1, "order:create")
	pc.Scope = queues.ScopeProcess
	h := newHarness(t, pc)
	q := h.client.Pools()[0].Queues()[0]
	require.NoError(t, h.redis.Client.Set(context.Background(), "asynq:{"+q+"}:paused", "compartment-gate", 0).Err())
	h.enqueue("order:create", job{Seq: 1, Work: time.Millisecond})
	h.run(h.obs.mux(t, "order:create"))
	h.obs.waitDone(t, "order", 1, 10*time.Second)
}

// Stop does not wait out the shutdown timeout for a job that is only
// waiting for a cluster-wide slot: it gives up and goes back to its queue.
func TestStopReleasesWaiters(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, nil)
	c.cfg.ShutdownTimeout = 20 * time.Second
	c.enqueue(clusterJob{Seq: 1, Work: 5 * time.Second})
	c.start(1)
	testwait.For(t, 10*time.Second, "the long job to start", func() bool {
		c.obs.mu.Lock()
		defer c.obs.mu.Unlock()
		return len(c.obs.starts) == 1
	})
	// A second process dequeues the next job while the pool is full, as
	// in the race window: the test keeps lifting the gate's pause by hand
	// until it does, and the job then waits for the slot.
	cfg := c.cfg
	cfg.Handlers = c.obs.handlers()
	second, err := queues.NewClient(c.r.Client, cfg)
	require.NoError(t, err)
	require.NoError(t, second.Start(context.Background()))
	c.enqueue(clusterJob{Seq: 2, Work: time.Millisecond})
	insp := asynq.NewInspectorFromRedisClient(c.r.Client)
	testwait.For(t, 10*time.Second, "the second job to be taken from its queue", func() bool {
		_ = c.r.Client.Del(context.Background(), "asynq:{"+c.cfg.Namespace+":batch}:paused").Err()
		info, err := insp.GetQueueInfo(c.cfg.Namespace + ":batch")
		return err == nil && info.Active == 2
	})
	began := time.Now()
	require.NoError(t, second.Stop(context.Background()))
	require.Less(t, time.Since(began), 3*time.Second, "Stop did not wait for the slot nor out the 20 s shutdown timeout")
}

// TestStopReturnsLookAheadJobs: a worker holding a job it took ahead of a
// slot (the look-ahead of a full cluster-scoped pool) gives it back when it
// stops, without running it and without using up a retry: due again at
// once, it is back in its queue at the next forward of due jobs. The jobs
// that run are asynq's to shut down, as for any pool.
func TestStopReturnsLookAheadJobs(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2, nil) // look-ahead: 1
	c.cfg.ShutdownTimeout = time.Second
	var logs apptest.SyncBuffer
	c.cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c.enqueue(clusterJob{Seq: 1, Work: time.Hour})
	c.enqueue(clusterJob{Seq: 2, Work: time.Hour})
	c.start(1)
	testwait.For(t, 10*time.Second, "the two long jobs to start", func() bool {
		c.obs.mu.Lock()
		defer c.obs.mu.Unlock()
		return len(c.obs.starts) == 2
	})
	c.enqueue(clusterJob{Seq: 3, Work: time.Millisecond})
	insp := asynq.NewInspectorFromRedisClient(c.r.Client)
	q := c.cfg.Namespace + ":batch"
	testwait.For(t, 10*time.Second, "the third job to be taken ahead of a slot", func() bool {
		info, err := insp.GetQueueInfo(q)
		return err == nil && info.Active == 3
	})
	require.NoError(t, c.runners[0].Stop(context.Background()))
	stopped := time.Now()

	c.obs.mu.Lock()
	require.Len(t, c.obs.starts, 2, "the job taken ahead never ran")
	c.obs.mu.Unlock()
	info, err := insp.GetQueueInfo(q)
	require.NoError(t, err)
	require.Zero(t, info.Active)
	require.Equal(t, 2, info.Pending, "the two running jobs went back to their queue at the shutdown timeout")
	require.Equal(t, 1, info.Retry, "the job taken ahead is due again")
	due, err := insp.ListRetryTasks(q)
	require.NoError(t, err)
	require.Len(t, due, 1)
	require.Zero(t, due[0].Retried, "no retry used up")
	// asynq keeps whole seconds: due no later than the second the stop
	// ended (a retry's backoff would put it 15 s or more ahead).
	require.False(t, due[0].NextProcessAt.After(stopped.Add(time.Second)), "due at once, not at %s", due[0].NextProcessAt)

	// The log says what happened: three jobs put back at shutdown, none
	// failed, no retry used. (A handler may end after Stop returns: asynq
	// does not wait for one it has given up on.)
	testwait.For(t, 10*time.Second, "a job line for each of the three jobs", func() bool {
		return strings.Count(logs.String(), "msg=job ") == 3
	})
	out := logs.String()
	require.Equal(t, 2, strings.Count(out, `outcome="put back at shutdown, no retry used"`), out)
	require.Equal(t, 1, strings.Count(out, `outcome="not started: put back at shutdown, no retry used"`), out)
	require.Equal(t, 1, strings.Count(out, `level=INFO msg="job put back at shutdown before it started; no retry used"`), out)
	require.NotContains(t, out, "will retry")
	require.NotContains(t, out, "failed")
}
