package queues

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"unicode/utf8"

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

// Permanent marks err as a permanent failure: the job is archived with err's
// message instead of being retried. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil || errors.Is(err, asynq.SkipRetry) {
		return err
	}
	return fmt.Errorf("%w (%w)", err, asynq.SkipRetry)
}

// Job names a job type and the Go type of its payload. Handlers registered
// with AddHandler and jobs enqueued with Enqueue for the same Job agree on
// the payload type at compile time; payloads travel as JSON.
type Job[P any] struct{ jobType string }

// NewJob returns the Job for jobType with payload type P. An empty job type
// is a programmer error: NewJob panics.
func NewJob[P any](jobType string) Job[P] {
	if jobType == "" {
		panic("queues: NewJob: empty job type")
	}
	return Job[P]{jobType: jobType}
}

// Type returns the job type.
func (j Job[P]) Type() string { return j.jobType }

// Encode returns the payload's JSON.
func (j Job[P]) Encode(p P) ([]byte, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("job type %q: encode payload: %w", j.jobType, err)
	}
	return b, nil
}

// Decode decodes a payload strictly (see DecodeJSON) and, when *P
// implements Validator, validates it. A payload that fails either is an
// error matching ErrMalformedPayload and asynq.SkipRetry.
func (j Job[P]) Decode(payload []byte) (P, error) {
	var p P
	if err := DecodeJSON(payload, &p); err != nil {
		return p, fmt.Errorf("job type %q: %w", j.jobType, err)
	}
	if v, ok := any(&p).(Validator); ok {
		if err := v.Validate(); err != nil {
			return p, Permanent(fmt.Errorf("job type %q: %w: %v", j.jobType, ErrMalformedPayload, err))
		}
	}
	return p, nil
}

// Request returns an enqueue request for the payload, for Client.EnqueueMany.
func (j Job[P]) Request(p P, o EnqueueOptions) (Request, error) {
	b, err := j.Encode(p)
	if err != nil {
		return Request{}, err
	}
	return Request{JobType: j.jobType, Payload: b, Options: o}, nil
}

// Enqueue enqueues one job of type job with payload p (see Client.Enqueue).
func Enqueue[P any](ctx context.Context, c *Client, job Job[P], p P, o EnqueueOptions) (EnqueueResult, error) {
	b, err := job.Encode(p)
	if err != nil {
		return EnqueueResult{}, err
	}
	return c.Enqueue(ctx, job.jobType, b, o)
}

// AddHandler registers fn for job on h. The payload is decoded with
// job.Decode before fn runs, so fn sees only payloads that decoded and
// validated. Registering a job type twice is a programmer error: AddHandler
// panics, naming it.
func AddHandler[P any](h *Handlers, job Job[P], fn func(ctx context.Context, payload P) error) {
	if fn == nil {
		panic(fmt.Sprintf("queues: AddHandler: nil function for job type %q", job.jobType))
	}
	h.Handle(job.jobType, asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		p, err := job.Decode(t.Payload())
		if err != nil {
			return err
		}
		return fn(ctx, p)
	}))
}

// Handlers dispatches a job to the handler registered for its type. It is
// safe for concurrent use. Every job type a pool routes needs a handler, and
// every handler's job type must be routed to a pool (Config.Validate checks
// both).
type Handlers struct {
	mu       sync.RWMutex
	handlers map[string]asynq.Handler
	order    []string

	// OnPanic, when set, is called with the job type, the panic value and the
	// stack after a handler panicked (the job has already been marked as a
	// permanent failure). Use it to log; Handlers itself never logs.
	OnPanic func(jobType string, value any, stack []byte)
}

// NewHandlers returns an empty Handlers.
func NewHandlers() *Handlers { return &Handlers{handlers: map[string]asynq.Handler{}} }

// Handle registers handler for jobType. An empty job type, a nil handler or
// a job type registered twice is a programmer error: Handle panics with a
// message that names it, as asynq's ServeMux does.
func (h *Handlers) Handle(jobType string, handler asynq.Handler) {
	if err := h.HandleSafely(jobType, handler); err != nil {
		panic(err.Error())
	}
}

// HandleSafely is Handle returning the problem as an error instead of
// panicking, for job types that come from input.
func (h *Handlers) HandleSafely(jobType string, handler asynq.Handler) error {
	if jobType == "" {
		return errors.New("queues: Handle: empty job type")
	}
	if handler == nil {
		return fmt.Errorf("queues: Handle: nil handler for job type %q", jobType)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.handlers == nil {
		h.handlers = map[string]asynq.Handler{} // a zero Handlers works too
	}
	if _, ok := h.handlers[jobType]; ok {
		return fmt.Errorf("queues: Handle: job type %q is already registered", jobType)
	}
	h.handlers[jobType] = handler
	h.order = append(h.order, jobType)
	return nil
}

// HandleFunc registers fn for jobType (see Handle).
func (h *Handlers) HandleFunc(jobType string, fn func(context.Context, *asynq.Task) error) {
	if fn == nil {
		panic(fmt.Sprintf("queues: HandleFunc: nil function for job type %q", jobType))
	}
	h.Handle(jobType, asynq.HandlerFunc(fn))
}

// JobTypes returns the registered job types in registration order.
func (h *Handlers) JobTypes() []string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return slices.Clone(h.order)
}

// Has reports whether jobType has a handler.
func (h *Handlers) Has(jobType string) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	_, ok := h.handlers[jobType]
	return ok
}

// ProcessTask runs the handler for the task's type. A panic becomes an error
// matching ErrPanic and asynq.SkipRetry; an unregistered type, an error
// matching ErrUnknownJobType and asynq.SkipRetry.
func (h *Handlers) ProcessTask(ctx context.Context, t *asynq.Task) (err error) {
	h.mu.RLock()
	handler, ok := h.handlers[t.Type()]
	h.mu.RUnlock()
	if !ok {
		return Permanent(fmt.Errorf("%w %q", ErrUnknownJobType, t.Type()))
	}
	defer func() {
		if v := recover(); v != nil {
			if h.OnPanic != nil {
				h.OnPanic(t.Type(), v, debug.Stack())
			}
			err = Permanent(fmt.Errorf("%w: job type %q: %v", ErrPanic, t.Type(), v))
		}
	}()
	return handler.ProcessTask(ctx, t)
}

// DecodeJSON decodes a job payload strictly: unknown fields, trailing data
// and type mismatches are errors matching ErrMalformedPayload and
// asynq.SkipRetry.
func DecodeJSON(payload []byte, out any) error {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return Permanent(fmt.Errorf("%w: %s", ErrMalformedPayload, cutMessage(err.Error())))
	}
	if dec.More() {
		return Permanent(fmt.Errorf("%w: data after the JSON value", ErrMalformedPayload))
	}
	return nil
}

// maxDecodeMessage bounds a decoder error kept with a job: encoding/json
// quotes a huge number or an unknown field name whole, and the message is
// stored in Redis with the job and logged.
const maxDecodeMessage = 200

// cutMessage cuts msg to maxDecodeMessage bytes, at a character boundary,
// saying how long it was.
func cutMessage(msg string) string {
	if len(msg) <= maxDecodeMessage {
		return msg
	}
	cut := maxDecodeMessage
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes)", msg[:cut], len(msg))
}

// Validator is implemented by payloads that can check their own fields after
// decoding.
type Validator interface{ Validate() error }
