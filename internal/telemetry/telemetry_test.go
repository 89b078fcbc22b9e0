package telemetry

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// Without an endpoint, or with the SDK disabled, nothing is set up and
// otel's globals stay as they were.
func TestSetupDoesNothingUnlessAsked(t *testing.T) {
	before := otel.GetTracerProvider()
	for _, env := range []map[string]string{
		{},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces", "OTEL_TRACES_EXPORTER": "none"},
	} {
		tr, err := Setup(context.Background(), "svc", envOf(env))
		require.NoError(t, err)
		require.False(t, tr.Enabled(), "%v", env)
		require.NoError(t, tr.Shutdown())
		require.Equal(t, before, otel.GetTracerProvider(), "%v", env)
	}
}

// A protocol the exporter does not speak is refused with the choices.
func TestSetupRefusesAnUnknownProtocol(t *testing.T) {
	_, err := Setup(context.Background(), "svc", envOf(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "zipkin"}))
	require.EqualError(t, err, `tracing: OTLP protocol "zipkin" is not supported: use http/protobuf or grpc`)
}

// What the worker logs of the endpoint never carries credentials or a
// query string.
func TestRedact(t *testing.T) {
	require.Equal(t, "https://collector:4318/v1/traces", redact("https://user:secret@collector:4318/v1/traces?token=abc#x"))
	require.Equal(t, "http://127.0.0.1:4317", redact("http://127.0.0.1:4317"))
	require.Equal(t, "(an endpoint that is not a URL)", redact("collector:4318"))
}
