package queues_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/queues"
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

var reportJob = queues.NewJob[payload]("report:run")

func TestHandlersRegistration(t *testing.T) {
	t.Parallel()
	h := queues.NewHandlers()
	ok := func(context.Context, *asynq.Task) error { return nil }
	h.HandleFunc("report:run", ok)
	require.PanicsWithValue(t, `queues: Handle: job type "report:run" is already registered`, func() { h.HandleFunc("report:run", ok) })
	require.PanicsWithValue(t, "queues: Handle: empty job type", func() { h.HandleFunc("", ok) })
	require.PanicsWithValue(t, `queues: Handle: nil handler for job type "x"`, func() { h.Handle("x", nil) })
	require.PanicsWithValue(t, `queues: AddHandler: nil function for job type "report:run"`, func() { queues.AddHandler(h, reportJob, nil) })
	require.PanicsWithValue(t, "queues: NewJob: empty job type", func() { queues.NewJob[payload]("") })
	require.EqualError(t, h.HandleSafely("report:run", asynq.HandlerFunc(ok)), `queues: Handle: job type "report:run" is already registered`)
	require.Equal(t, []string{"report:run"}, h.JobTypes())
	require.True(t, h.Has("report:run"))
	require.False(t, h.Has("x"))
}

func TestHandlersDispatchAndFailures(t *testing.T) {
	t.Parallel()
	h := queues.NewHandlers()
	var got payload
	queues.AddHandler(h, reportJob, func(_ context.Context, p payload) error {
		got = p
		return nil
	})
	boom := errors.New("database unavailable")
	h.HandleFunc("order:create", func(context.Context, *asynq.Task) error { return boom })
	var panicType string
	var panicValue any
	h.OnPanic = func(jobType string, v any, stack []byte) {
		panicType, panicValue = jobType, v
		require.NotEmpty(t, stack)
	}
	h.HandleFunc("search:index", func(context.Context, *asynq.Task) error { panic("index corrupt") })
	ctx := context.Background()

	require.NoError(t, h.ProcessTask(ctx, asynq.NewTask("report:run", []byte(`{"report":"vat-return","period":"2026-10"}`))))
	require.Equal(t, payload{Report: "vat-return", Period: "2026-10"}, got)

	err := h.ProcessTask(ctx, asynq.NewTask("order:create", nil))
	require.Same(t, boom, err, "a handler's own error is returned unchanged, so asynq retries it")

	cases := []struct {
		name    string
		task    *asynq.Task
		is      error
		message string
	}{
		{"panic", asynq.NewTask("search:index", nil), queues.ErrPanic,
			`handler panicked: job type "search:index": index corrupt (skip retry for the task)`},
		{"unknown job type", asynq.NewTask("refund:issue", nil), queues.ErrUnknownJobType,
			`no handler for job type "refund:issue" (skip retry for the task)`},
		{"not JSON", asynq.NewTask("report:run", []byte(`report=vat`)), queues.ErrMalformedPayload,
			`job type "report:run": malformed payload: invalid character 'r' looking for beginning of value (skip retry for the task)`},
		{"unknown field", asynq.NewTask("report:run", []byte(`{"report":"a","tier":"x"}`)), queues.ErrMalformedPayload,
			`job type "report:run": malformed payload: json: unknown field "tier" (skip retry for the task)`},
		{"trailing data", asynq.NewTask("report:run", []byte(`{"report":"a"} {}`)), queues.ErrMalformedPayload,
			`job type "report:run": malformed payload: data after the JSON value (skip retry for the task)`},
		{"fails validation", asynq.NewTask("report:run", []byte(`{"period":"2026-10"}`)), queues.ErrMalformedPayload,
			`job type "report:run": malformed payload: report is required (skip retry for the task)`},
		{"empty payload", asynq.NewTask("report:run", nil), queues.ErrMalformedPayload,
			`job type "report:run": malformed payload: EOF (skip retry for the task)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := h.ProcessTask(ctx, tc.task)
			require.ErrorIs(t, err, tc.is)
			require.ErrorIs(t, err, asynq.SkipRetry, "a permanent failure is archived, not retried")
			require.EqualError(t, err, tc.message)
		})
	}
	require.Equal(t, "search:index", panicType)
	require.Equal(t, "index corrupt", panicValue)
}

func TestPermanent(t *testing.T) {
	t.Parallel()
	require.NoError(t, queues.Permanent(nil))
	err := queues.Permanent(errors.New("bad period"))
	require.ErrorIs(t, err, asynq.SkipRetry)
	require.Same(t, err, queues.Permanent(err), "marking twice changes nothing")
}

// A payload with a huge value that encoding/json quotes whole (an unknown
// field's name, an overflowing number) fails with a bounded message.
func TestDecodeErrorsAreBounded(t *testing.T) {
	t.Parallel()
	type p struct {
		N int `json:"n"`
	}
	job := queues.NewJob[p]("x")
	huge := strings.Repeat("9", 10<<20)
	for name, payload := range map[string]string{
		"unknown field":       `{"` + strings.Repeat("k", 10<<20) + `": 1}`,
		"overflowing number":  `{"n": ` + huge + `}`,
		"fraction for an int": `{"n": 1.` + huge + `}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := job.Decode([]byte(payload))
			require.ErrorIs(t, err, queues.ErrMalformedPayload)
			require.Less(t, len(err.Error()), 400, "the message is cut")
			require.Contains(t, err.Error(), "bytes)")
		})
	}
}
