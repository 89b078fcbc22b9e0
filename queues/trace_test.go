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
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// tracer is an SDK tracer provider that keeps its spans in memory, as a
// service (or a worker process) of its own would export them.
type tracer struct {
	exp *tracetest.InMemoryExporter
	tp  *sdktrace.TracerProvider
}

func newTracer(t *testing.T) *tracer {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &tracer{exp: exp, tp: tp}
}

// named returns the ended spans called name.
func (tr *tracer) named(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range tr.exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		out[kv.Key] = kv.Value
	}
	return out
}

func hasEvent(s tracetest.SpanStub, name string) (sdktrace.Event, bool) {
	for _, e := range s.Events {
		if e.Name == name {
			return e, true
		}
	}
	return sdktrace.Event{}, false
}

// One trace, from a request's span in the service that enqueues, through
// the enqueue (by the door's script for the batch pool, through asynq for
// the orders pool) and a wait for a slot in a full cluster-scoped pool, to
// the runs in a worker that shares nothing with the service but Redis: its
// own client, its own tracer provider. The handler's own span is a child
// of the run's.
func TestTraceFromRequestToRun(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	ns := r.Namespace(t)
	pools := []queues.PoolConfig{
		{Name: "orders", Size: 2, JobTypes: []string{"order:create"}, Scope: queues.ScopeProcess, PollInterval: 10 * time.Millisecond},
		// One slot cluster-wide; each process runs up to 2, so the second
		// report is taken ahead of the slot and waits for it.
		{Name: "batch", Size: 1, MaxSize: 2, JobTypes: []string{"report:run"}, MaxBacklog: 10, PollInterval: 10 * time.Millisecond},
	}
	service, worker := newTracer(t), newTracer(t)
	enq, err := queues.NewClient(r.Client, queues.Config{Namespace: ns, Pools: pools, Logger: slog.New(slog.DiscardHandler), TracerProvider: service.tp})
	require.NoError(t, err)

	release := make(chan struct{})
	var once sync.Once
	releaseFirst := func() { once.Do(func() { close(release) }) }
	defer releaseFirst()
	var first sync.Once
	h := queues.NewHandlers()
	h.HandleFunc("report:run", func(ctx context.Context, task *asynq.Task) error {
		_, span := worker.tp.Tracer("handler").Start(ctx, "render report")
		defer span.End()
		isFirst := false
		first.Do(func() { isFirst = true })
		if isFirst {
			select { // hold the pool's one slot until the second report waits for it
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	})
	h.HandleFunc("order:create", func(context.Context, *asynq.Task) error { return nil })
	w, err := queues.NewClient(r.Client, queues.Config{Namespace: ns, Pools: pools, Logger: slog.New(slog.DiscardHandler), Handlers: h, TracerProvider: worker.tp})
	require.NoError(t, err)

	ctx, request := service.tp.Tracer("http").Start(context.Background(), "POST /month-end", trace.WithSpanKind(trace.SpanKindServer))
	res, err := enq.EnqueueMany(ctx, []queues.Request{
		{JobType: "report:run", Options: queues.EnqueueOptions{ID: "r1"}},
		{JobType: "report:run", Options: queues.EnqueueOptions{ID: "r2"}},
		{JobType: "order:create", Options: queues.EnqueueOptions{ID: "o1"}},
	})
	require.NoError(t, err)
	request.End()
	for _, r := range res {
		require.Equal(t, queues.Enqueued, r.Outcome)
	}

	require.NoError(t, w.Start(context.Background()))
	defer func() { require.NoError(t, w.Stop(context.Background())) }()
	testwait.For(t, 30*time.Second, "the second report to wait for the slot the first holds", func() bool {
		st, err := enq.Stats(context.Background())
		require.NoError(t, err)
		var running, waiting int64
		for _, q := range st.Queues {
			if q.Pool == "batch" {
				running += q.Running
				waiting += q.WaitingForSlot
			}
		}
		return running == 1 && waiting == 1
	})
	// The first report keeps the slot at least this long after the
	// second was seen waiting: the second's span must show that wait.
	const held = 150 * time.Millisecond
	seenWaiting := time.Now()
	testwait.For(t, 10*time.Second, "the slot to be held a while longer", func() bool { return time.Since(seenWaiting) >= held })
	releaseFirst()
	testwait.For(t, 30*time.Second, "three runs to end", func() bool {
		return len(worker.named("run report:run"))+len(worker.named("run order:create")) == 3
	})

	traceID := request.SpanContext().TraceID()
	enqueues := map[string]tracetest.SpanStub{} // by job ID
	for _, s := range append(service.named("enqueue report:run"), service.named("enqueue order:create")...) {
		require.Equal(t, trace.SpanKindProducer, s.SpanKind)
		require.Equal(t, traceID, s.SpanContext.TraceID(), "the enqueue is in the request's trace")
		require.Equal(t, request.SpanContext().SpanID(), s.Parent.SpanID(), "the enqueue is the request's child")
		a := attrs(s)
		require.Equal(t, "enqueued", a[queues.AttrOutcome].AsString())
		enqueues[a[queues.AttrJobID].AsString()] = s
	}
	require.Len(t, enqueues, 3)
	require.Equal(t, "batch", attrs(enqueues["r1"])[queues.AttrPool].AsString())
	require.Equal(t, "orders", attrs(enqueues["o1"])[queues.AttrPool].AsString())

	runs := append(worker.named("run report:run"), worker.named("run order:create")...)
	var slotWaits []float64
	for _, s := range runs {
		a := attrs(s)
		id := a[queues.AttrJobID].AsString()
		parent, ok := enqueues[id]
		require.True(t, ok, "run of %q", id)
		require.Equal(t, trace.SpanKindConsumer, s.SpanKind)
		require.Equal(t, traceID, s.SpanContext.TraceID(), "the run of %s is in the request's trace", id)
		require.Equal(t, parent.SpanContext.SpanID(), s.Parent.SpanID(), "the run of %s is its enqueue's child", id)
		require.True(t, s.Parent.IsRemote())
		require.Equal(t, "succeeded", a[queues.AttrOutcome].AsString())
		require.Equal(t, int64(0), a[queues.AttrRetryCount].AsInt64())
		require.Equal(t, "", a[queues.AttrTier].AsString())
		require.Contains(t, a, queues.AttrWait, "a first attempt knows its wait")
		if a[queues.AttrPool].AsString() == "batch" {
			require.Equal(t, "report:run", a[queues.AttrJobType].AsString())
			require.Contains(t, a, queues.AttrSlotWait)
			slotWaits = append(slotWaits, a[queues.AttrSlotWait].AsFloat64())
		} else {
			require.NotContains(t, a, queues.AttrSlotWait, "a process-scoped pool has no cluster-wide slot")
		}
	}
	require.Len(t, slotWaits, 2)
	require.GreaterOrEqual(t, max(slotWaits[0], slotWaits[1]), float64(held.Milliseconds()), "the second report waited for the slot the first held")

	require.Len(t, worker.named("render report"), 2, "each report's handler made its span")
	for _, s := range worker.named("render report") {
		var run tracetest.SpanStub
		for _, r := range runs {
			if r.SpanContext.SpanID() == s.Parent.SpanID() {
				run = r
			}
		}
		require.Equal(t, "run report:run", run.Name, "the handler's span is the run's child")
	}
}

// The door's refusal is an event on the refused job's enqueue span, whose
// status is the error the caller gets; the circuit breaker holding a job
// back is an event on that job's run span, which is not a failure; a
// handler's failure is an error on its run's span.
func TestTraceDoorAndBreakerEvents(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	ns := r.Namespace(t)
	pools := []queues.PoolConfig{
		{Name: "batch", Size: 1, JobTypes: []string{"report:run"}, MaxBacklog: 1, Scope: queues.ScopeProcess, PollInterval: 10 * time.Millisecond},
		{Name: "db", Size: 2, JobTypes: []string{"db:run"}, Scope: queues.ScopeProcess, PollInterval: 10 * time.Millisecond,
			Breaker: &queues.BreakerConfig{MinCalls: 2, Window: 10 * time.Second, CoolDown: time.Minute, Probes: 1}},
		{Name: "flaky", Size: 1, JobTypes: []string{"flaky:run"}, Scope: queues.ScopeProcess, PollInterval: 10 * time.Millisecond},
	}
	tr := newTracer(t)
	cfg := queues.Config{Namespace: ns, Pools: pools, Logger: slog.New(slog.DiscardHandler), TracerProvider: tr.tp,
		RetryDelay: func(int, error) time.Duration { return time.Hour }}
	c, err := queues.NewClient(r.Client, cfg)
	require.NoError(t, err)
	ctx := context.Background()
	_, err = c.Enqueue(ctx, "report:run", nil, queues.EnqueueOptions{ID: "r1"})
	require.NoError(t, err)
	_, err = c.Enqueue(ctx, "report:run", nil, queues.EnqueueOptions{ID: "r2"})
	var backlog *queues.BacklogError
	require.ErrorAs(t, err, &backlog)

	spans := tr.named("enqueue report:run")
	require.Len(t, spans, 2)
	refused := spans[1]
	require.Equal(t, "not enqueued", attrs(refused)[queues.AttrOutcome].AsString())
	e, ok := hasEvent(refused, queues.EventDoorRefused)
	require.True(t, ok, "the refusal is an event")
	ea := map[attribute.Key]attribute.Value{}
	for _, kv := range e.Attributes {
		ea[kv.Key] = kv.Value
	}
	require.Equal(t, "backlog", ea[queues.AttrReason].AsString())
	require.Equal(t, codes.Error, refused.Status.Code)
	require.Equal(t, err.Error(), refused.Status.Description)
	_, ok = hasEvent(spans[0], queues.EventDoorRefused)
	require.False(t, ok, "the admitted job has no refusal")

	// The db pool's breaker is open, so its queue is paused; lifting that
	// pause behind the breaker's back (as asynq's own tools can) lets a
	// job be taken, which the breaker then holds back, again and again.
	_, err = c.ForceBreaker(ctx, "db", queues.BreakerForceOpen)
	require.NoError(t, err)
	_, err = c.EnqueueMany(ctx, []queues.Request{{JobType: "db:run"}, {JobType: "flaky:run"}})
	require.NoError(t, err)
	ran := make(chan string, 10)
	h := queues.NewHandlers()
	h.HandleFunc("report:run", func(context.Context, *asynq.Task) error { return nil })
	h.HandleFunc("db:run", func(context.Context, *asynq.Task) error { ran <- "db:run"; return nil })
	h.HandleFunc("flaky:run", func(context.Context, *asynq.Task) error { return errors.New("database unreachable") })
	wcfg := cfg
	wcfg.Handlers = h
	w, err := queues.NewClient(r.Client, wcfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	defer func() { require.NoError(t, w.Stop(ctx)) }()
	db, err := c.Pool("db")
	require.NoError(t, err)
	require.NoError(t, asynq.NewInspectorFromRedisClient(r.Client).UnpauseQueue(db.Queues()[0]))
	var held, failed tracetest.SpanStub
	testwait.For(t, 30*time.Second, "a run held back by the open breaker, and a failed one", func() bool {
		for _, s := range tr.named("run db:run") {
			if _, ok := hasEvent(s, queues.EventBreakerHeldBack); ok {
				held = s
			}
		}
		if f := tr.named("run flaky:run"); len(f) > 0 {
			failed = f[0]
		}
		return held.Name != "" && failed.Name != ""
	})
	require.Equal(t, "held back", attrs(held)[queues.AttrOutcome].AsString())
	require.NotEqual(t, codes.Error, held.Status.Code, "held back is not a failure")
	require.Empty(t, ran, "the held-back job's handler did not run")
	require.Equal(t, "retried", attrs(failed)[queues.AttrOutcome].AsString())
	require.Equal(t, codes.Error, failed.Status.Code, "a failure is an error on its span")
	require.Equal(t, "database unreachable", failed.Status.Description)
}

// A job that waited while its pool's breaker held the pool's jobs back
// gets an event on its run's span when the pool resumes, saying how much
// of its wait the pause took; a job that waited through no pause gets
// none.
func TestTraceBreakerPause(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	ns := r.Namespace(t)
	pools := []queues.PoolConfig{{Name: "db", Size: 1, JobTypes: []string{"db:run"}, Scope: queues.ScopeProcess, PollInterval: 10 * time.Millisecond,
		Breaker: &queues.BreakerConfig{MinCalls: 2, Window: 10 * time.Second, CoolDown: time.Minute, Probes: 1}}}
	tr := newTracer(t)
	ctx := context.Background()
	c, err := queues.NewClient(r.Client, queues.Config{Namespace: ns, Pools: pools, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	h := queues.NewHandlers()
	h.HandleFunc("db:run", func(context.Context, *asynq.Task) error { return nil })
	var log apptest.SyncBuffer
	w, err := queues.NewClient(r.Client, queues.Config{Namespace: ns, Pools: pools, Handlers: h, TracerProvider: tr.tp,
		Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	defer func() { require.NoError(t, w.Stop(ctx)) }()

	_, err = c.Enqueue(ctx, "db:run", nil, queues.EnqueueOptions{})
	require.NoError(t, err)
	testwait.For(t, 30*time.Second, "a first job to run with the breaker closed", func() bool { return len(tr.named("run db:run")) == 1 })
	_, ok := hasEvent(tr.named("run db:run")[0], queues.EventBreakerPaused)
	require.False(t, ok, "no pause, no event")

	_, err = c.ForceBreaker(ctx, "db", queues.BreakerForceOpen)
	require.NoError(t, err)
	testwait.For(t, 30*time.Second, "the worker to see the breaker open", func() bool {
		return strings.Contains(log.String(), `msg="circuit breaker seen" pool=db component=breaker from=closed to=open`)
	})
	ready := time.Now()
	_, err = c.Enqueue(ctx, "db:run", nil, queues.EnqueueOptions{})
	require.NoError(t, err)
	testwait.For(t, 10*time.Second, "the pause to last a while", func() bool { return time.Since(ready) >= 100*time.Millisecond })
	_, err = c.ForceBreaker(ctx, "db", queues.BreakerReset)
	require.NoError(t, err)
	testwait.For(t, 30*time.Second, "the held job to run once the pool resumes", func() bool { return len(tr.named("run db:run")) >= 2 })
	var run tracetest.SpanStub
	for _, s := range tr.named("run db:run") {
		if attrs(s)[queues.AttrOutcome].AsString() == "succeeded" {
			run = s // the last one that ran
		}
	}
	e, ok := hasEvent(run, queues.EventBreakerPaused)
	require.True(t, ok, "the job waited through the pause")
	require.False(t, e.Time.Before(ready), "the event is placed where the pause and the job's wait begin to overlap")
	var paused float64
	for _, kv := range e.Attributes {
		if kv.Key == queues.AttrPaused {
			paused = kv.Value.AsFloat64()
		}
	}
	require.GreaterOrEqual(t, paused, 100.0, "the pause took at least the 100 ms it was held open")
}

// Tracing off: with a no-op provider the engine carries no trace header
// at all, even for a request that has a trace; with the default (the
// global provider, no SDK installed) it makes no spans but carries the
// request's trace on, as otel's instrumentations do.
func TestTraceHeaders(t *testing.T) {
	t.Parallel()
	// A long trace state too: its header's entry in asynq's message needs
	// a two-byte length, and asynq must read it back whole.
	state, err := trace.ParseTraceState("vendor=" + strings.Repeat("x", 200))
	require.NoError(t, err)
	parent := trace.SpanContext{}.WithTraceID(trace.TraceID{1, 2, 3}).WithSpanID(trace.SpanID{4, 5, 6}).WithTraceFlags(trace.FlagsSampled).WithTraceState(state)
	ctx := trace.ContextWithSpanContext(context.Background(), parent)
	for _, tc := range []struct {
		name  string
		tp    trace.TracerProvider
		carry bool
	}{
		{"default provider", nil, true},
		{"no-op provider", tracenoop.NewTracerProvider(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testredis.New(t)
			ns := r.Namespace(t)
			pools := []queues.PoolConfig{
				{Name: "orders", Size: 1, JobTypes: []string{"order:create"}, Scope: queues.ScopeProcess, PollInterval: 10 * time.Millisecond},
				{Name: "batch", Size: 1, JobTypes: []string{"report:run"}, MaxBacklog: 5, Scope: queues.ScopeProcess, PollInterval: 10 * time.Millisecond},
			}
			headers := make(chan map[string]string, 2)
			h := queues.NewHandlers()
			keep := func(_ context.Context, task *asynq.Task) error { headers <- task.Headers(); return nil }
			h.HandleFunc("order:create", keep)
			h.HandleFunc("report:run", keep)
			c, err := queues.NewClient(r.Client, queues.Config{Namespace: ns, Pools: pools, Logger: slog.New(slog.DiscardHandler), Handlers: h, TracerProvider: tc.tp})
			require.NoError(t, err)
			_, err = c.EnqueueMany(ctx, []queues.Request{{JobType: "order:create"}, {JobType: "report:run"}})
			require.NoError(t, err)
			require.NoError(t, c.Start(context.Background()))
			defer func() { require.NoError(t, c.Stop(context.Background())) }()
			for range 2 {
				var got map[string]string
				select {
				case got = <-headers:
				case <-time.After(30 * time.Second):
					t.Fatal("a job did not run")
				}
				if tc.carry {
					require.Equal(t, "00-01020300000000000000000000000000-0405060000000000-01", got["traceparent"])
					require.Equal(t, "vendor="+strings.Repeat("x", 200), got["tracestate"])
				} else {
					require.NotContains(t, got, "traceparent")
					require.NotContains(t, got, "tracestate")
				}
				require.Contains(t, got, "compartment-ready-at")
			}
		})
	}
}
