package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/telemetry/otlptest"
	"github.com/lci-labs/compartment/internal/testredis"
)

// TestEnqueueExportsTraces: with OTEL_EXPORTER_OTLP_ENDPOINT set, `enqueue
// job` exports the command's span and the job's enqueue span, its child,
// before it exits, and the job carries that trace in its headers for the
// worker to go on with (TestWorkerExportsTraces in cmd/worker). Not
// parallel: the exporter reads the process's environment.
func TestEnqueueExportsTraces(t *testing.T) {
	rcv := otlptest.New(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL())
	t.Setenv("OTEL_SERVICE_NAME", "billing-cron")
	r := testredis.New(t)
	path := apptest.Config(t, r, "")
	var out, errOut bytes.Buffer
	code := run(context.Background(), cli.Env{Args: []string{"-config", path, "job", "-type", "order:create", "-payload", orderPayload}, Stdout: &out, Stderr: &errOut, Getenv: otlptest.Getenv})
	require.Equal(t, 0, code, errOut.String())

	// Sent at exit, without waiting for a batch.
	cmd := rcv.Named("enqueue job")
	require.Len(t, cmd, 1)
	jobs := rcv.Named("enqueue order:create")
	require.Len(t, jobs, 1)
	require.Equal(t, "billing-cron", jobs[0].Service, "OTEL_SERVICE_NAME names the service")
	require.Equal(t, cmd[0].TraceID, jobs[0].TraceID)
	require.Equal(t, cmd[0].SpanID, jobs[0].Parent)
	require.Equal(t, "enqueued", jobs[0].Attrs["compartment.outcome"])
	id := jobs[0].Attrs["compartment.job.id"]
	require.NotEmpty(t, id)

	insp := asynq.NewInspectorFromRedisClient(r.Client)
	queues, err := insp.Queues()
	require.NoError(t, err)
	var headers map[string]string
	for _, q := range queues {
		if info, err := insp.GetTaskInfo(q, id); err == nil {
			headers = info.Headers
		}
	}
	require.Equal(t, "00-"+jobs[0].TraceID+"-"+jobs[0].SpanID+"-01", headers["traceparent"], "the job carries its enqueue span's context")
}

// A protocol the exporter does not speak is a usage error that names the
// choices, and enqueues nothing.
func TestEnqueueTracingBadProtocol(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	r := testredis.New(t)
	path := apptest.Config(t, r, "")
	var out, errOut bytes.Buffer
	code := run(context.Background(), cli.Env{Args: []string{"-config", path, "job", "-type", "order:create", "-payload", orderPayload}, Stdout: &out, Stderr: &errOut, Getenv: otlptest.Getenv})
	require.Equal(t, 2, code)
	require.Equal(t, "enqueue: tracing: OTLP protocol \"http/json\" is not supported: use http/protobuf or grpc\n", errOut.String())
	cfg, err := app.Load(path, nil)
	require.NoError(t, err)
	keys, err := r.Client.Keys(context.Background(), "*"+cfg.Engine.Namespace+"*").Result()
	require.NoError(t, err)
	for _, k := range keys {
		require.NotContains(t, k, ":pending", "nothing was enqueued")
	}
}
