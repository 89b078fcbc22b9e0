package handlers_test

import (
	"context"
	"errors"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/handlers"
)

type payload struct {
	Report string `json:"report"`
	Period string `json:"period"`
}

func (p *payload) Validate() error {
	if p.Report == "" {
		return errors.New("report is required")
	}
	return nil
}

func TestMuxRegistration(t *testing.T) {
	m := handlers.NewMux()
	ok := func(context.Context, *asynq.Task) error { return nil }
	require.NoError(t, m.HandleFunc("report:run", ok))
	require.EqualError(t, m.HandleFunc("report:run", ok), `handlers: job type "report:run" is already registered`)
	require.EqualError(t, m.HandleFunc("", ok), "handlers: empty job type")
	require.EqualError(t, m.Handle("x", nil), `handlers: nil handler for job type "x"`)
	require.Equal(t, []string{"report:run"}, m.JobTypes())
	require.True(t, m.Has("report:run"))
	require.False(t, m.Has("x"))
}

func TestMuxDispatchAndFailures(t *testing.T) {
	m := handlers.NewMux()
	var got payload
	require.NoError(t, m.Handle("report:run", handlers.JSON(func(_ context.Context, p payload) error {
		got = p
		return nil
	})))
	boom := errors.New("database unavailable")
	require.NoError(t, m.HandleFunc("order:create", func(context.Context, *asynq.Task) error { return boom }))
	var panicType string
	var panicValue any
	m.OnPanic = func(jobType string, v any, stack []byte) {
		panicType, panicValue = jobType, v
		require.NotEmpty(t, stack)
	}
	require.NoError(t, m.HandleFunc("search:index", func(context.Context, *asynq.Task) error { panic("index corrupt") }))
	ctx := context.Background()

	require.NoError(t, m.ProcessTask(ctx, asynq.NewTask("report:run", []byte(`{"report":"vat-return","period":"2026-10"}`))))
	require.Equal(t, payload{Report: "vat-return", Period: "2026-10"}, got)

	err := m.ProcessTask(ctx, asynq.NewTask("order:create", nil))
	require.Same(t, boom, err, "a handler's own error is returned unchanged, so asynq retries it")

	cases := []struct {
		name    string
		task    *asynq.Task
		is      error
		message string
	}{
		{"panic", asynq.NewTask("search:index", nil), handlers.ErrPanic,
			`handler panicked: job type "search:index": index corrupt (skip retry for the task)`},
		{"unknown job type", asynq.NewTask("refund:issue", nil), handlers.ErrUnknownJobType,
			`no handler for job type "refund:issue" (skip retry for the task)`},
		{"not JSON", asynq.NewTask("report:run", []byte(`report=vat`)), handlers.ErrMalformedPayload,
			`job type "report:run": malformed payload: invalid character 'r' looking for beginning of value (skip retry for the task)`},
		{"unknown field", asynq.NewTask("report:run", []byte(`{"report":"a","tier":"x"}`)), handlers.ErrMalformedPayload,
			`job type "report:run": malformed payload: json: unknown field "tier" (skip retry for the task)`},
		{"trailing data", asynq.NewTask("report:run", []byte(`{"report":"a"} {}`)), handlers.ErrMalformedPayload,
			`job type "report:run": malformed payload: data after the JSON value (skip retry for the task)`},
		{"fails validation", asynq.NewTask("report:run", []byte(`{"period":"2026-10"}`)), handlers.ErrMalformedPayload,
			`job type "report:run": malformed payload: report is required (skip retry for the task)`},
		{"empty payload", asynq.NewTask("report:run", nil), handlers.ErrMalformedPayload,
			`job type "report:run": malformed payload: EOF (skip retry for the task)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := m.ProcessTask(ctx, tc.task)
			require.ErrorIs(t, err, tc.is)
			require.ErrorIs(t, err, asynq.SkipRetry, "a permanent failure is archived, not retried")
			require.EqualError(t, err, tc.message)
		})
	}
	require.Equal(t, "search:index", panicType)
	require.Equal(t, "index corrupt", panicValue)
}

func TestPermanent(t *testing.T) {
	require.NoError(t, handlers.Permanent(nil))
	err := handlers.Permanent(errors.New("bad period"))
	require.ErrorIs(t, err, asynq.SkipRetry)
	require.Same(t, err, handlers.Permanent(err), "marking twice changes nothing")
}
