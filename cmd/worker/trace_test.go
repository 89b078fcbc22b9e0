package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/telemetry/otlptest"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// TestWorkerExportsTraces: with OTEL_EXPORTER_OTLP_ENDPOINT set, the
// worker exports by OTLP a span for each run of a job, the child of the
// span a service made when it enqueued the job (a library client here,
// with its own tracer provider, sharing only Redis with the worker), under
// the worker's service name; the job's own attributes ride along. Not
// parallel: the exporter reads the process's environment.
func TestWorkerExportsTraces(t *testing.T) {
	rcv := otlptest.New(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL())
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50") // ms: export soon after each span
	r := testredis.New(t)
	path := apptest.Config(t, r, "")

	w := startWorker(t, cli.Env{Args: []string{"-config", path}, Getenv: otlptest.Getenv})
	errOut := w.log
	require.Contains(t, errOut.String(), "tracing: exporting spans by OTLP")

	spans := tracetest.NewInMemoryExporter()
	service := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer func() { _ = service.Shutdown(context.Background()) }()
	cfg, err := app.Load(path, nil)
	require.NoError(t, err)
	engine := cfg.Engine
	engine.TracerProvider = service
	enq, err := queues.NewClient(r.Client, engine)
	require.NoError(t, err)
	reqCtx, request := service.Tracer("http").Start(context.Background(), "POST /orders")
	res, err := enq.Enqueue(reqCtx, "order:create", []byte(`{"region":"north","category":"books","customer_id":7,"amount_cents":1299}`), queues.EnqueueOptions{})
	require.NoError(t, err)
	request.End()

	var runs []otlptest.Span
	testwait.For(t, 30*time.Second, "the worker to export the job's run", func() bool {
		runs = rcv.Named("run order:create")
		return len(runs) > 0
	})
	w.stop(t)
	got := runs[0]
	require.Equal(t, "compartment-worker", got.Service)
	require.Equal(t, request.SpanContext().TraceID().String(), got.TraceID, "the run is in the request's trace")
	var enqueue tracetest.SpanStub
	for _, s := range spans.GetSpans() {
		if s.Name == "enqueue order:create" {
			enqueue = s
		}
	}
	require.Equal(t, trace.SpanKindProducer, enqueue.SpanKind)
	require.Equal(t, enqueue.SpanContext.SpanID().String(), got.Parent, "the run is the child of the enqueue's span")
	require.Equal(t, res.ID, got.Attrs[string(queues.AttrJobID)])
	require.Equal(t, "order", got.Attrs[string(queues.AttrPool)])
	require.Equal(t, "succeeded", got.Attrs[string(queues.AttrOutcome)])
}
