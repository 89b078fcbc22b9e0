// Package bulkhead isolates the parts of a program from each other by giving
// each part a fixed number of slots for concurrent work.
//
// A Bulkhead has a name and a maximum number of concurrent executions. Work
// runs inside a slot; when every slot is taken, the bulkhead rejects new work
// at once with a *FullError (errors.Is(err, ErrFull) holds), so the caller can
// do something else instead of piling up behind the busy part. A bounded wait
// (Config.MaxWait) is available for callers that prefer a short delay to a
// rejection; waiters are admitted first come, first served.
//
// The name comes from ship building: watertight compartments keep a leak in
// one compartment from sinking the whole ship. Give each function whose
// failure must not take the others down its own bulkhead, sized to its share
// of the resource they all use (for example 8 order, 8 search and 4 batch
// connections out of a database pool of 20).
//
// A slot is always released: when the work returns, returns an error, panics,
// or when its context is cancelled. A Registry hands each function its
// bulkhead by name.
//
// The package never logs; Stats gives counters an exporter can read.
package bulkhead

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// ErrFull is the sentinel matched by every rejection: errors.Is(err, ErrFull)
// is true for a *FullError.
var ErrFull = errors.New("bulkhead: full")

// FullError is returned when a bulkhead has no free slot for a call. It says
// which bulkhead and how full it was, so the message a user reads names the
// compartment: `bulkhead "batch" is full (4/4)`.
type FullError struct {
	// Name is the bulkhead's name.
	Name string
	// Active is the number of slots in use when the call was turned away.
	Active int
	// Max is the bulkhead's MaxConcurrent.
	Max int
	// Waited is how long the call waited for a slot before it gave up; zero
	// when it was rejected at once.
	Waited time.Duration
	// Cause is the context's error when the caller's context ended while it
	// waited; nil otherwise. errors.Is(err, context.Canceled) finds it.
	Cause error
}

// Error reads like `bulkhead "batch" is full (4/4)`, with the wait and the
// context's error added when there were any.
func (e *FullError) Error() string {
	msg := fmt.Sprintf("bulkhead %q is full (%d/%d)", e.Name, e.Active, e.Max)
	if e.Waited > 0 {
		msg += fmt.Sprintf(" after waiting %s", e.Waited.Round(time.Millisecond))
	}
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Is reports whether target is ErrFull.
func (e *FullError) Is(target error) bool { return target == ErrFull }

// Unwrap returns the context error that ended the wait, if any.
func (e *FullError) Unwrap() error { return e.Cause }

// Config describes a bulkhead. It is plain data; New validates it and never
// changes a value silently.
type Config struct {
	// Name identifies the bulkhead in errors, stats and a Registry. Required.
	Name string
	// MaxConcurrent is the number of slots: at most this many executions run
	// at once. Required; must be >= 1.
	MaxConcurrent int
	// MaxWait is the longest a call waits for a free slot before it is
	// rejected. Defaults to 0, which rejects at once when the bulkhead is full.
	// Waiting holds a goroutine and the caller's resources; keep it short.
	MaxWait time.Duration
}

// Validate reports every problem with c, each naming its field; nil when c
// can build a bulkhead.
func (c Config) Validate() error {
	var errs []error
	if c.Name == "" {
		errs = append(errs, errors.New("bulkhead: Name must not be empty"))
	}
	label := c.Name
	if label == "" {
		label = "(unnamed)"
	}
	if c.MaxConcurrent < 1 {
		errs = append(errs, fmt.Errorf("bulkhead %q: MaxConcurrent must be >= 1, got %d", label, c.MaxConcurrent))
	}
	if c.MaxWait < 0 {
		errs = append(errs, fmt.Errorf("bulkhead %q: MaxWait must be >= 0, got %s", label, c.MaxWait))
	}
	return errors.Join(errs...)
}

// Bulkhead caps the number of concurrent executions. It is safe for
// concurrent use. Create one with New or Registry.Register.
type Bulkhead struct {
	name    string
	max     int
	maxWait time.Duration

	// slots holds one token per execution in progress. A buffered channel
	// gives a lock-free fast path, and goroutines blocked sending on it are
	// served in arrival order, which makes waiting first come, first served:
	// a freed slot goes straight to the oldest waiter, never to a newcomer.
	slots chan struct{}

	accepted  atomic.Uint64
	rejected  atomic.Uint64
	completed atomic.Uint64
	failed    atomic.Uint64
	panicked  atomic.Uint64
	waiting   atomic.Int64
}

// New returns a bulkhead for cfg, or the validation error naming every bad
// field.
func New(cfg Config) (*Bulkhead, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Bulkhead{
		name:    cfg.Name,
		max:     cfg.MaxConcurrent,
		maxWait: cfg.MaxWait,
		slots:   make(chan struct{}, cfg.MaxConcurrent),
	}, nil
}

// Name returns the bulkhead's name.
func (b *Bulkhead) Name() string { return b.name }

// MaxConcurrent returns the number of slots.
func (b *Bulkhead) MaxConcurrent() int { return b.max }

// MaxWait returns how long a call may wait for a slot; 0 means no wait.
func (b *Bulkhead) MaxWait() time.Duration { return b.maxWait }

// Active returns the number of slots in use. Active()+Available() equals
// MaxConcurrent() at every observation.
func (b *Bulkhead) Active() int { return len(b.slots) }

// Available returns the number of free slots.
func (b *Bulkhead) Available() int { return b.max - len(b.slots) }

// IsFull reports whether every slot is in use.
func (b *Bulkhead) IsFull() bool { return len(b.slots) == b.max }

// Execute runs fn in a slot and returns fn's error unchanged.
//
// When every slot is taken, Execute does not run fn and returns a *FullError:
// at once when MaxWait is 0, otherwise when a slot has not come free within
// MaxWait or when ctx ends, whichever comes first (the FullError then carries
// ctx.Err() as its Cause). If ctx has already ended, Execute returns ctx.Err()
// without running fn.
//
// The slot is released however fn ends: returning, returning an error, or
// panicking (the panic continues after the release).
func (b *Bulkhead) Execute(ctx context.Context, fn func(context.Context) error) (err error) {
	if err := b.acquire(ctx); err != nil {
		return err
	}
	finished := false
	defer func() {
		b.release()
		if !finished {
			// fn panicked or called runtime.Goexit.
			b.panicked.Add(1)
		}
	}()
	err = fn(ctx)
	finished = true
	if err != nil {
		b.failed.Add(1)
	} else {
		b.completed.Add(1)
	}
	return err
}

// Do runs fn in a slot of b and returns its value and error; it behaves like
// Execute in every other way. On rejection it returns T's zero value and a
// *FullError.
func Do[T any](ctx context.Context, b *Bulkhead, fn func(context.Context) (T, error)) (T, error) {
	var out T
	err := b.Execute(ctx, func(ctx context.Context) error {
		var err error
		out, err = fn(ctx)
		return err
	})
	return out, err
}

// TryAcquire takes a slot without waiting and reports whether it got one. A
// caller that got a slot must call Release exactly once when its work is done.
// Prefer Execute, which cannot leak a slot.
func (b *Bulkhead) TryAcquire() bool {
	select {
	case b.slots <- struct{}{}:
		b.accepted.Add(1)
		return true
	default:
		b.rejected.Add(1)
		return false
	}
}

// Acquire takes a slot under the same rules as Execute: at once, within
// MaxWait, or not at all. On success the caller must call Release exactly
// once; on failure it returns ctx.Err() or a *FullError and holds nothing.
func (b *Bulkhead) Acquire(ctx context.Context) error { return b.acquire(ctx) }

// Release returns a slot taken with TryAcquire or Acquire. Releasing a slot
// that is not held is a programming error and panics, as it would otherwise
// let the bulkhead admit more work than its size.
func (b *Bulkhead) Release() {
	b.completed.Add(1)
	b.release()
}

func (b *Bulkhead) release() {
	select {
	case <-b.slots:
	default:
		panic(fmt.Sprintf("bulkhead %q: Release called without a held slot", b.name))
	}
}

func (b *Bulkhead) acquire(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case b.slots <- struct{}{}:
		b.accepted.Add(1)
		return nil
	default:
	}
	if b.maxWait <= 0 {
		b.rejected.Add(1)
		return &FullError{Name: b.name, Active: b.max, Max: b.max}
	}
	return b.wait(ctx)
}

// wait blocks for a slot for at most maxWait. It is the slow path, kept apart
// so that the fast path does not pay for the timer.
func (b *Bulkhead) wait(ctx context.Context) error {
	b.waiting.Add(1)
	defer b.waiting.Add(-1)
	start := time.Now()
	timer := time.NewTimer(b.maxWait)
	defer timer.Stop()
	select {
	case b.slots <- struct{}{}:
		b.accepted.Add(1)
		return nil
	case <-timer.C:
		b.rejected.Add(1)
		return &FullError{Name: b.name, Active: b.max, Max: b.max, Waited: time.Since(start)}
	case <-ctx.Done():
		b.rejected.Add(1)
		return &FullError{Name: b.name, Active: b.max, Max: b.max, Waited: time.Since(start), Cause: ctx.Err()}
	}
}

// Stats is a point-in-time view of a bulkhead's counters. Counters only grow;
// Active and Waiting are gauges.
type Stats struct {
	Name      string
	Max       int
	Active    int
	Available int
	// Waiting is the number of calls waiting for a slot now.
	Waiting int
	// Accepted counts calls that got a slot.
	Accepted uint64
	// Rejected counts calls turned away with a FullError (or a false
	// TryAcquire).
	Rejected uint64
	// Completed counts executions whose fn returned nil, and Release calls.
	Completed uint64
	// Failed counts executions whose fn returned an error.
	Failed uint64
	// Panicked counts executions whose fn panicked (or called
	// runtime.Goexit).
	Panicked uint64
}

// Stats returns the counters. It takes no lock; each value is read
// atomically, but the set is not one atomic snapshot.
func (b *Bulkhead) Stats() Stats {
	active := len(b.slots)
	return Stats{
		Name:      b.name,
		Max:       b.max,
		Active:    active,
		Available: b.max - active,
		Waiting:   int(b.waiting.Load()),
		Accepted:  b.accepted.Load(),
		Rejected:  b.rejected.Load(),
		Completed: b.completed.Load(),
		Failed:    b.failed.Load(),
		Panicked:  b.panicked.Load(),
	}
}
