package queues_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// ran records, from inside a handler, each run of a job: its ID, the queue
// asynq gave it from, its retry count and payload.
type ran struct {
	ID, Queue string
	Retried   int
	Payload   string
}

type runLog struct {
	mu   sync.Mutex
	runs []ran
}

func (l *runLog) record(ctx context.Context, t *asynq.Task) ran {
	id, _ := asynq.GetTaskID(ctx)
	q, _ := asynq.GetQueueName(ctx)
	n, _ := asynq.GetRetryCount(ctx)
	r := ran{ID: id, Queue: q, Retried: n, Payload: string(t.Payload())}
	l.mu.Lock()
	l.runs = append(l.runs, r)
	l.mu.Unlock()
	return r
}

// handlers run report:run jobs that only record their run.
func (l *runLog) handlers() *queues.Handlers {
	mux := queues.NewHandlers()
	mux.HandleFunc("report:run", func(ctx context.Context, task *asynq.Task) error {
		l.record(ctx, task)
		return nil
	})
	return mux
}

func (l *runLog) all() []ran {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]ran(nil), l.runs...)
}

func (l *runLog) waitFor(t *testing.T, n int) []ran {
	t.Helper()
	testwait.For(t, 30*time.Second, fmt.Sprintf("%d runs", n), func() bool { return len(l.all()) >= n })
	return l.all()
}

// A pending job moved to a higher tier keeps its ID, payload, headers and
// options, goes to the tail of that tier's queue, and a worker runs it
// there in that order: after the jobs already waiting in the tier, before
// every job of the lower tiers.
func TestPromotePending(t *testing.T) {
	t.Parallel()
	h := newHarness(t, pool("batch", 1, "report:run", "regulatory", "close", "adhoc"))
	ctx := context.Background()
	enq := func(id, tier string) queues.EnqueueResult {
		res, err := h.client.Enqueue(ctx, "report:run", []byte("payload of "+id), queues.EnqueueOptions{ID: id, Tier: tier})
		require.NoError(t, err)
		return res
	}
	enq("r1", "regulatory")
	enq("r2", "regulatory")
	enq("a1", "adhoc")
	a2 := enq("a2", "adhoc")
	enq("a3", "adhoc")
	before, err := h.insp.GetTaskInfo(a2.Queue, "a2")
	require.NoError(t, err)

	res, err := h.client.Promote(ctx, "report:run", "a2", "regulatory")
	require.NoError(t, err)
	regulatory, _ := h.client.Pools()[0].QueueFor("regulatory")
	require.Equal(t, queues.PromoteResult{ID: "a2", Pool: "batch", From: "adhoc", To: "regulatory", Queue: regulatory, State: "pending", Moved: true}, res)

	_, err = h.insp.GetTaskInfo(a2.Queue, "a2")
	require.ErrorIs(t, err, asynq.ErrTaskNotFound, "no copy is left in the old tier")
	after, err := h.insp.GetTaskInfo(regulatory, "a2")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, after.State)
	require.Equal(t, regulatory, after.Queue)
	for _, f := range []func(*asynq.TaskInfo) any{
		func(i *asynq.TaskInfo) any { return i.Type }, func(i *asynq.TaskInfo) any { return string(i.Payload) },
		func(i *asynq.TaskInfo) any { return i.MaxRetry },
		func(i *asynq.TaskInfo) any { return i.Retried }, func(i *asynq.TaskInfo) any { return i.Timeout },
		func(i *asynq.TaskInfo) any { return i.Retention },
	} {
		require.Equal(t, f(before), f(after))
	}
	// Its wait restarts in the new tier (as asynq's pending_since does):
	// the starvation guard counts it from the promotion.
	require.Len(t, after.Headers, len(before.Headers))
	require.Greater(t, after.Headers["compartment-ready-at"], before.Headers["compartment-ready-at"])

	var log runLog
	h.run(log.handlers())
	runs := log.waitFor(t, 5)
	var order []string
	for _, r := range runs {
		order = append(order, r.ID)
		require.Equal(t, "payload of "+r.ID, r.Payload)
	}
	require.Equal(t, []string{"r1", "r2", "a2", "a1", "a3"}, order, "each job ran once, a2 at the tail of regulatory")
	require.Equal(t, regulatory, runs[2].Queue, "asynq handed a2 out from its new tier's queue")
}

// A scheduled job keeps its due time and runs from its new tier's queue
// when due; a job waiting for a retry keeps its retry count and the
// failures counted against it, and runs from its new tier.
func TestPromoteScheduledAndRetry(t *testing.T) {
	t.Parallel()
	pc := pool("batch", 1, "report:run", "regulatory", "close", "adhoc")
	pc.MaxRetry = 1
	h := newHarness(t, pc)
	h.cfg.RetryDelay = func(int, error) time.Duration { return time.Hour }
	h.cfg.DelayedCheckInterval = 50 * time.Millisecond
	ctx := context.Background()
	regulatory, _ := h.client.Pools()[0].QueueFor("regulatory")

	var log runLog
	mux := queues.NewHandlers()
	mux.HandleFunc("report:run", func(ctx context.Context, task *asynq.Task) error {
		if r := log.record(ctx, task); r.ID == "f" && r.Retried == 0 {
			return errors.New("first run fails")
		}
		return nil
	})
	h.run(mux)

	// A job that fails once waits an hour for its retry, in adhoc.
	f, err := h.client.Enqueue(ctx, "report:run", []byte("f"), queues.EnqueueOptions{ID: "f", Tier: "adhoc"})
	require.NoError(t, err)
	testwait.For(t, 10*time.Second, "f to wait for its retry", func() bool {
		info, err := h.insp.GetTaskInfo(f.Queue, "f")
		return err == nil && info.State == asynq.TaskStateRetry
	})
	// A job due in 2 s, in close.
	s, err := h.client.Enqueue(ctx, "report:run", []byte("s"), queues.EnqueueOptions{ID: "s", Tier: "close", ProcessIn: 2 * time.Second})
	require.NoError(t, err)
	sBefore, err := h.insp.GetTaskInfo(s.Queue, "s")
	require.NoError(t, err)

	res, err := h.client.Promote(ctx, "report:run", "s", "regulatory")
	require.NoError(t, err)
	require.True(t, res.Moved)
	require.Equal(t, "scheduled", res.State)
	sAfter, err := h.insp.GetTaskInfo(regulatory, "s")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateScheduled, sAfter.State)
	require.Equal(t, sBefore.NextProcessAt, sAfter.NextProcessAt, "the due time is kept")

	res, err = h.client.Promote(ctx, "report:run", "f", "regulatory")
	require.NoError(t, err)
	require.Equal(t, "retry", res.State)
	require.True(t, res.Moved)
	fAfter, err := h.insp.GetTaskInfo(regulatory, "f")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateRetry, fAfter.State)
	require.Equal(t, 1, fAfter.Retried)
	require.Equal(t, "first run fails", fAfter.LastErr)
	// The failure counted against f moved with it (the key of
	// queues.failureCountKey).
	ns := h.client.Namespace()
	n, err := h.redis.Client.Get(ctx, ns+":failures:"+regulatory+":f").Int()
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Zero(t, h.redis.Client.Exists(ctx, ns+":failures:"+f.Queue+":f").Val())

	// Bring f's retry forward in its new queue, as an operator would.
	require.NoError(t, h.insp.RunTask(regulatory, "f"))
	runs := log.waitFor(t, 3)
	byID := map[string][]ran{}
	for _, r := range runs {
		byID[r.ID] = append(byID[r.ID], r)
	}
	require.Len(t, byID["s"], 1)
	require.Equal(t, regulatory, byID["s"][0].Queue)
	require.Len(t, byID["f"], 2)
	require.Equal(t, ran{ID: "f", Queue: regulatory, Retried: 1, Payload: "f"}, byID["f"][1])
}

// A running job and a finished one are not moved: the result says so and
// nothing changes. An unknown job, tier or job type is an error and
// nothing changes.
func TestPromoteNotWaiting(t *testing.T) {
	t.Parallel()
	h := newHarness(t, pool("batch", 1, "report:run", "regulatory", "close", "adhoc"), pool("order", 1, "order:create"))
	ctx := context.Background()
	release := make(chan struct{})
	var log runLog
	mux := queues.NewHandlers()
	mux.HandleFunc("report:run", func(ctx context.Context, task *asynq.Task) error {
		log.record(ctx, task)
		<-release
		return nil
	})
	mux.HandleFunc("order:create", noop)
	h.run(mux)

	x, err := h.client.Enqueue(ctx, "report:run", []byte("x"), queues.EnqueueOptions{ID: "x", Tier: "adhoc", Retention: time.Hour})
	require.NoError(t, err)
	log.waitFor(t, 1)
	res, err := h.client.Promote(ctx, "report:run", "x", "regulatory")
	require.NoError(t, err)
	require.Equal(t, queues.PromoteResult{ID: "x", Pool: "batch", From: "adhoc", To: "regulatory", Queue: x.Queue, State: "active"}, res)
	info, err := h.insp.GetTaskInfo(x.Queue, "x")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateActive, info.State, "the running job stays where it runs")

	// Bad requests, with a job waiting behind x: nothing moves.
	y, err := h.client.Enqueue(ctx, "report:run", []byte("y"), queues.EnqueueOptions{ID: "y", Tier: "close"})
	require.NoError(t, err)
	for _, tc := range []struct {
		jobType, id, tier string
		want              error
		msg               string
	}{
		{"report:run", "nope", "regulatory", queues.ErrJobNotFound, `pool "batch" has no job "nope"`},
		{"report:run", "y", "urgent", queues.ErrInvalidPromote, `pool "batch" does not serve tier "urgent"`},
		{"report:run", "y", "", queues.ErrInvalidPromote, `does not serve tier ""`},
		{"report:run", "", "regulatory", queues.ErrInvalidPromote, "the job ID is empty"},
		{"order:create", "y", "regulatory", queues.ErrInvalidPromote, `pool "order" has no tiers`},
		{"report:other", "y", "regulatory", queues.ErrInvalidPromote, "report:other"},
	} {
		_, err := h.client.Promote(ctx, tc.jobType, tc.id, tc.tier)
		require.ErrorIs(t, err, tc.want, "%+v", tc)
		require.ErrorContains(t, err, tc.msg)
	}
	info, err = h.insp.GetTaskInfo(y.Queue, "y")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State)

	// Already in the tier asked for: nothing to do.
	res, err = h.client.Promote(ctx, "report:run", "y", "close")
	require.NoError(t, err)
	require.Equal(t, queues.PromoteResult{ID: "y", Pool: "batch", From: "close", To: "close", Queue: y.Queue, State: "pending"}, res)

	close(release)
	testwait.For(t, 10*time.Second, "x to complete", func() bool {
		info, err := h.insp.GetTaskInfo(x.Queue, "x")
		return err == nil && info.State == asynq.TaskStateCompleted
	})
	res, err = h.client.Promote(ctx, "report:run", "x", "regulatory")
	require.NoError(t, err)
	require.Equal(t, "completed", res.State)
	require.False(t, res.Moved)
	runs := log.waitFor(t, 2)
	require.Equal(t, []string{"x", "y"}, []string{runs[0].ID, runs[1].ID}, "each ran once, where it was")
	require.Equal(t, y.Queue, runs[1].Queue)
}

// A job moved into a tier the cluster gate holds paused (it had no
// pending jobs when the gate last settled) is not stuck: the gate's
// keeper settles the flags within its tick (2 s), and a worker takes the
// job at its next poll. Here the source tier is paused by an operator, so
// no job starts or ends to settle the flags sooner.
func TestPromoteIntoGatePausedTier(t *testing.T) {
	t.Parallel()
	pc := pool("batch", 1, "report:run", "regulatory", "close", "adhoc")
	pc.Scope = queues.ScopeCluster
	h := newHarness(t, pc)
	ctx := context.Background()
	p := h.client.Pools()[0]
	closeQ, _ := p.QueueFor("close")
	adhoc, _ := p.QueueFor("adhoc")
	paused := func(q string) string { return "asynq:{" + q + "}:paused" }

	var log runLog
	h.run(log.handlers())
	_, err := h.client.Enqueue(ctx, "report:run", []byte("z"), queues.EnqueueOptions{ID: "z", Tier: "close"})
	require.NoError(t, err)
	log.waitFor(t, 1)
	testwait.For(t, 10*time.Second, "the gate to lift its pauses once z is done", func() bool {
		return h.redis.Client.Exists(ctx, paused(closeQ), paused(adhoc)).Val() == 0
	})

	// An operator pauses close (by hand, see docs/CLUSTER.md) and a job
	// waits there; adhoc is paused by the gate, as the gate leaves it when
	// close had a pending job.
	require.NoError(t, h.redis.Client.Set(ctx, paused(closeQ), "operator", 0).Err())
	_, err = h.client.Enqueue(ctx, "report:run", []byte("d"), queues.EnqueueOptions{ID: "d", Tier: "close"})
	require.NoError(t, err)
	require.NoError(t, h.redis.Client.Set(ctx, paused(adhoc), "compartment-gate", 0).Err())

	res, err := h.client.Promote(ctx, "report:run", "d", "adhoc")
	require.NoError(t, err)
	require.True(t, res.Moved)
	took := testwait.For(t, 10*time.Second, "the moved job to run", func() bool { return len(log.all()) == 2 })
	t.Logf("a job moved into a tier the gate held paused ran %s later", took.Round(10*time.Millisecond))
	require.Equal(t, adhoc, log.all()[1].Queue)
	require.Less(t, took, 2*time.Second+time.Second, "within a keeper tick and a poll")
	require.Equal(t, "operator", h.redis.Client.Get(ctx, paused(closeQ)).Val(), "the operator's pause stays")
}
