// Package handlers registers job handlers by job type and makes their
// failures explicit: a handler that panics, or a job whose payload cannot be
// decoded, fails permanently with the reason (the job is archived, not
// retried 25 times), and the worker process never crashes because of one job.
package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"

	"github.com/hibiken/asynq"
)

// ErrPanic is matched by the error a job fails with when its handler
// panicked. The error also matches asynq.SkipRetry: a panic is a bug, and
// retrying it would only repeat it.
var ErrPanic = errors.New("handler panicked")

// ErrMalformedPayload is matched by the error a job fails with when its
// payload cannot be decoded. It also matches asynq.SkipRetry: the payload
// will not change on a retry.
var ErrMalformedPayload = errors.New("malformed payload")

// ErrUnknownJobType is matched by the error for a job whose type has no
// handler. It also matches asynq.SkipRetry.
var ErrUnknownJobType = errors.New("no handler for job type")

// Permanent marks err as a permanent failure: asynq archives the job with
// err's message instead of retrying it.
func Permanent(err error) error {
	if err == nil || errors.Is(err, asynq.SkipRetry) {
		return err
	}
	return fmt.Errorf("%w (%w)", err, asynq.SkipRetry)
}

// Mux dispatches a job to the handler registered for its type. It is safe
// for concurrent use.
type Mux struct {
	mu       sync.RWMutex
	handlers map[string]asynq.Handler
	order    []string

	// OnPanic, when set, is called with the job type, the panic value and the
	// stack after a handler panicked (the job has already been marked as a
	// permanent failure). Use it to log; the package itself never logs.
	OnPanic func(jobType string, value any, stack []byte)
}

// NewMux returns an empty Mux.
func NewMux() *Mux { return &Mux{handlers: map[string]asynq.Handler{}} }

// Handle registers h for jobType. An empty job type, a nil handler or a job
// type registered twice is an error.
func (m *Mux) Handle(jobType string, h asynq.Handler) error {
	if jobType == "" {
		return errors.New("handlers: empty job type")
	}
	if h == nil {
		return fmt.Errorf("handlers: nil handler for job type %q", jobType)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.handlers[jobType]; ok {
		return fmt.Errorf("handlers: job type %q is already registered", jobType)
	}
	m.handlers[jobType] = h
	m.order = append(m.order, jobType)
	return nil
}

// HandleFunc registers fn for jobType.
func (m *Mux) HandleFunc(jobType string, fn func(context.Context, *asynq.Task) error) error {
	return m.Handle(jobType, asynq.HandlerFunc(fn))
}

// JobTypes returns the registered job types in registration order.
func (m *Mux) JobTypes() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Clone(m.order)
}

// Has reports whether jobType has a handler.
func (m *Mux) Has(jobType string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, ok := m.handlers[jobType]
	return ok
}

// ProcessTask runs the handler for the task's type. A panic becomes an error
// matching ErrPanic and asynq.SkipRetry; an unregistered type, an error
// matching ErrUnknownJobType and asynq.SkipRetry.
func (m *Mux) ProcessTask(ctx context.Context, t *asynq.Task) (err error) {
	m.mu.RLock()
	h, ok := m.handlers[t.Type()]
	m.mu.RUnlock()
	if !ok {
		return Permanent(fmt.Errorf("%w %q", ErrUnknownJobType, t.Type()))
	}
	defer func() {
		if v := recover(); v != nil {
			if m.OnPanic != nil {
				m.OnPanic(t.Type(), v, debug.Stack())
			}
			err = Permanent(fmt.Errorf("%w: job type %q: %v", ErrPanic, t.Type(), v))
		}
	}()
	return h.ProcessTask(ctx, t)
}

// DecodeJSON decodes a job payload strictly: unknown fields, trailing data
// and type mismatches are errors matching ErrMalformedPayload and
// asynq.SkipRetry.
func DecodeJSON(payload []byte, out any) error {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return Permanent(fmt.Errorf("%w: %v", ErrMalformedPayload, err))
	}
	if dec.More() {
		return Permanent(fmt.Errorf("%w: data after the JSON value", ErrMalformedPayload))
	}
	return nil
}

// Validator is implemented by payloads that can check their own fields after
// decoding.
type Validator interface{ Validate() error }

// JSON adapts a typed function to an asynq.Handler: the payload is decoded
// strictly into P (and validated when P implements Validator); a payload that
// fails either is a permanent failure naming the job type and the cause.
func JSON[P any](fn func(ctx context.Context, payload P) error) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		var p P
		if err := DecodeJSON(t.Payload(), &p); err != nil {
			return fmt.Errorf("job type %q: %w", t.Type(), err)
		}
		if v, ok := any(&p).(Validator); ok {
			if err := v.Validate(); err != nil {
				return Permanent(fmt.Errorf("job type %q: %w: %v", t.Type(), ErrMalformedPayload, err))
			}
		}
		return fn(ctx, p)
	})
}
