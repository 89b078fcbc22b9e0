package queues

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TracerName is the name of the tracer the engine takes from
// Config.TracerProvider: its spans' instrumentation scope.
const TracerName = "github.com/lci-labs/compartment/queues"

// The attributes of the engine's spans (docs/TRACING.md).
const (
	AttrPool       = attribute.Key("compartment.pool")
	AttrTier       = attribute.Key("compartment.tier")
	AttrJobType    = attribute.Key("compartment.job.type")
	AttrJobID      = attribute.Key("compartment.job.id")
	AttrRetryCount = attribute.Key("compartment.job.retry_count")
	// AttrWait is how long the job waited from the moment it was ready to
	// its start, in milliseconds (first attempts of jobs a Client
	// enqueued; see JobStart.Wait).
	AttrWait = attribute.Key("compartment.job.wait_ms")
	// AttrSlotWait is how long a job of a cluster-scoped pool waited in
	// its worker process for a cluster-wide slot, in milliseconds.
	AttrSlotWait = attribute.Key("compartment.slot.wait_ms")
	// AttrOutcome is a run's JobOutcome (or "held back" for a job the
	// circuit breaker sent back), or an enqueue's EnqueueOutcome.
	AttrOutcome = attribute.Key("compartment.outcome")
	// AttrReason is why the door refused a job: "backlog" or "rate".
	AttrReason = attribute.Key("compartment.door.reason")
	// AttrPaused is how much of a job's wait its pool's circuit breaker
	// held the pool's jobs back, in milliseconds.
	AttrPaused = attribute.Key("compartment.breaker.paused_ms")
)

// Span event names.
const (
	EventDoorRefused       = "door refused"
	EventBreakerPaused     = "breaker paused the pool"
	EventBreakerHeldBack   = "breaker held back"
	EventSlotWaitGaveUp    = "gave up waiting for a slot"
	EventFenced            = "taken over by another process"
	outcomeBreakerHeldBack = "held back"
)

// tracing makes the engine's spans: a producer span for each job a Client
// enqueues, whose context the job carries in its asynq headers, and a
// consumer span for each run of a job, the child of that context, so that
// a trace goes from the request that enqueued a job to its run in another
// process. nil (no spans at all, no headers) when Config.TracerProvider is
// a no-op provider.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	clock  func() time.Time
}

func newTracing(cfg Config) *tracing {
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	switch tp.(type) {
	case noop.TracerProvider, *noop.TracerProvider:
		return nil
	}
	prop := cfg.Propagator
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	clock := cfg.Clock
	if clock == nil {
		clock = time.Now
	}
	return &tracing{tracer: tp.Tracer(TracerName), prop: prop, clock: clock}
}

// enqueueSpans are the producer spans of one EnqueueMany call, one per
// request, and the trace headers each job carries (key, value pairs; nil
// when there is no trace to carry).
type enqueueSpans struct {
	spans   []trace.Span
	headers [][]string
}

// startEnqueue starts a producer span for each job of the batch.
func (tr *tracing) startEnqueue(ctx context.Context, b *batch) *enqueueSpans {
	if tr == nil {
		return nil
	}
	es := &enqueueSpans{spans: make([]trace.Span, len(b.reqs)), headers: make([][]string, len(b.reqs))}
	for i, r := range b.reqs {
		sctx, span := tr.tracer.Start(ctx, "enqueue "+r.JobType, trace.WithSpanKind(trace.SpanKindProducer))
		es.spans[i] = span
		if span.IsRecording() {
			span.SetAttributes(AttrPool.String(b.pools[i].Name()), AttrTier.String(b.results[i].Tier), AttrJobType.String(r.JobType))
		}
		if !span.SpanContext().IsValid() {
			continue // nothing to carry: no SDK, and no trace in ctx
		}
		carrier := propagation.MapCarrier{}
		tr.prop.Inject(sctx, carrier)
		keys := make([]string, 0, len(carrier))
		for k := range carrier {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			es.headers[i] = append(es.headers[i], k, carrier[k])
		}
	}
	return es
}

// of returns the trace headers job i carries, nil without any.
func (es *enqueueSpans) of(i int) []string {
	if es == nil {
		return nil
	}
	return es.headers[i]
}

// end ends the batch's spans with each job's result; err is what
// EnqueueMany returns. A job the door refused gets an event saying why.
func (es *enqueueSpans) end(b *batch, err error) {
	if es == nil {
		return
	}
	var reason string
	var backlog *BacklogError
	var rate *RateLimitError
	switch {
	case errors.As(err, &backlog):
		reason = "backlog"
	case errors.As(err, &rate):
		reason = "rate"
	}
	for i, span := range es.spans {
		if !span.IsRecording() {
			span.End()
			continue
		}
		res := b.results[i]
		span.SetAttributes(AttrOutcome.String(res.Outcome.String()))
		if res.ID != "" {
			span.SetAttributes(AttrJobID.String(res.ID))
		}
		if err != nil && res.Outcome == NotEnqueued {
			if reason != "" && b.pools[i].cfg.HasDoor() {
				span.AddEvent(EventDoorRefused, trace.WithAttributes(AttrReason.String(reason), attribute.String("message", err.Error())))
			}
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// runSpan follows one run of a job; nil without tracing (its methods
// then do nothing).
type runSpan struct {
	span  trace.Span
	clock func() time.Time
	ready time.Time // when the job was first ready (zero: unknown, or a retry)
}

// startRun starts the consumer span of a run of job t in pool p, the
// child of the trace its headers carry, and returns the context the
// handler gets (holding the span, so the handler's own spans are its
// children).
func (tr *tracing) startRun(ctx context.Context, p *Pool, t *asynq.Task) (context.Context, *runSpan) {
	if tr == nil {
		return ctx, nil
	}
	ctx = tr.prop.Extract(ctx, propagation.MapCarrier(t.Headers()))
	ctx, span := tr.tracer.Start(ctx, "run "+t.Type(), trace.WithSpanKind(trace.SpanKindConsumer))
	if !span.IsRecording() {
		span.End() // nothing records it: end it now, follow nothing
		return ctx, nil
	}
	id, _ := asynq.GetTaskID(ctx)
	queue, _ := asynq.GetQueueName(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	span.SetAttributes(AttrPool.String(p.Name()), AttrTier.String(p.TierOf(queue)), AttrJobType.String(t.Type()),
		AttrJobID.String(id), AttrRetryCount.Int(retried))
	return ctx, &runSpan{span: span, clock: tr.clock, ready: readyAt(t, retried)}
}

// begin notes that the handler starts now: the job's wait since it was
// ready, as JobStart.Wait measures it (the wait for a slot included).
func (s *runSpan) begin() {
	if s != nil && !s.ready.IsZero() {
		s.span.SetAttributes(AttrWait.Float64(ms(max(0, s.clock().Sub(s.ready)))))
	}
}

// breakerPaused adds, to the run of a job that was ready while its pool's
// circuit breaker held the pool's jobs back (as this process last saw the
// breaker), an event at the moment the pause began (or the job became
// ready, if later) saying how long of the job's wait it took.
func (s *runSpan) breakerPaused(b *breaker) {
	if s == nil || b == nil || s.ready.IsZero() {
		return
	}
	if from, to, ok := b.pausedWithin(s.ready, time.Now()); ok {
		s.span.AddEvent(EventBreakerPaused, trace.WithTimestamp(from), trace.WithAttributes(AttrPaused.Float64(ms(to.Sub(from)))))
	}
}

// slotWait notes how long the job waited for a cluster-wide slot.
func (s *runSpan) slotWait(d time.Duration) {
	if s != nil {
		s.span.SetAttributes(AttrSlotWait.Float64(ms(d)))
	}
}

// event adds an event to the run's span.
func (s *runSpan) event(name string, attrs ...attribute.KeyValue) {
	if s != nil {
		s.span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// end ends the run's span with its outcome: err is what the pool's
// handler returns to asynq, stopping whether the client is stopping.
func (s *runSpan) end(ctx context.Context, err error, stopping bool) {
	if s == nil {
		return
	}
	outcome := string(outcomeOf(ctx, err, stopping))
	switch {
	case errors.Is(err, errBreakerOpen):
		outcome = outcomeBreakerHeldBack
	case errors.Is(err, errBreakerRedis):
		// Redis did not answer the breaker's question: back to the
		// queue, no retry used.
		outcome = string(OutcomeRequeued)
	case errors.Is(err, errGateWait) && !stopping:
		s.span.AddEvent(EventSlotWaitGaveUp)
	}
	s.span.SetAttributes(AttrOutcome.String(outcome))
	if outcome == string(OutcomeRetried) || outcome == string(OutcomeArchived) {
		s.span.RecordError(err)
		s.span.SetStatus(codes.Error, err.Error())
	}
	s.span.End()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
