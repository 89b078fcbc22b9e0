// Package telemetry sets up OpenTelemetry tracing for the commands: an
// OTLP exporter when the standard OTEL_* variables ask for one, nothing
// otherwise. The engine (package queues) depends only on the API; this
// package is where the SDK comes in.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// ShutdownTimeout bounds how long Shutdown waits to send the spans still
// buffered when a command exits.
const ShutdownTimeout = 5 * time.Second

// Tracing is the tracing a command set up; its zero value (no exporter)
// does nothing.
type Tracing struct {
	tp *sdktrace.TracerProvider
	// Endpoint says where the spans go (scheme, host and path, without
	// credentials or query), "" when nothing is exported.
	Endpoint string
	// Protocol is the OTLP protocol: "http/protobuf" or "grpc".
	Protocol string
}

// Enabled reports whether spans are exported.
func (t *Tracing) Enabled() bool { return t != nil && t.tp != nil }

// Shutdown sends the buffered spans and stops the exporter, waiting at
// most ShutdownTimeout.
func (t *Tracing) Shutdown() error {
	if !t.Enabled() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	return t.tp.Shutdown(ctx)
}

// Setup exports spans by OTLP when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (and neither OTEL_SDK_DISABLED
// is true nor OTEL_TRACES_EXPORTER is "none"): it installs an SDK tracer
// provider and the W3C trace-context and baggage propagators as otel's
// globals, which the engine uses by default, and the command's handlers
// can too. The exporter reads the rest of the standard variables itself
// (headers, timeout, compression, certificates), and the SDK reads
// OTEL_TRACES_SAMPLER and OTEL_BSP_*; OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES name the service (service defaults it). The
// protocol is OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or
// OTEL_EXPORTER_OTLP_PROTOCOL: http/protobuf (the default) or grpc.
// Without an endpoint it changes nothing and returns a Tracing that does
// nothing.
func Setup(ctx context.Context, service string, getenv func(string) string) (*Tracing, error) {
	endpoint := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if endpoint == "" {
		endpoint = getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if endpoint == "" || strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || getenv("OTEL_TRACES_EXPORTER") == "none" {
		return &Tracing{}, nil
	}
	protocol := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if protocol == "" {
		protocol = "http/protobuf"
	}
	var exp sdktrace.SpanExporter
	var err error
	switch protocol {
	case "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("tracing: OTLP protocol %q is not supported: use http/protobuf or grpc", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	fromEnv, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	// The environment's service name, if it gives one, wins over ours.
	res, err := resource.Merge(resource.NewSchemaless(attribute.String("service.name", service)), fromEnv)
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return &Tracing{tp: tp, Endpoint: redact(endpoint), Protocol: protocol}, nil
}

// Announce logs where the spans go, or nothing when none are exported.
func (t *Tracing) Announce(log *slog.Logger) {
	if t.Enabled() {
		log.Info("tracing: exporting spans by OTLP", "endpoint", t.Endpoint, "protocol", t.Protocol)
	}
}

// redact drops what a URL may carry that is secret: its user info and its
// query.
func redact(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return "(an endpoint that is not a URL)"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}
