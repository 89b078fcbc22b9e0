package bulkhead_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lci-labs/compartment/internal/testwait"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lci-labs/compartment/bulkhead"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func mustNew(t *testing.T, cfg bulkhead.Config) *bulkhead.Bulkhead {
	t.Helper()
	b, err := bulkhead.New(cfg)
	require.NoError(t, err)
	return b
}

func TestNewValidation(t *testing.T) {
	cases := []struct {
		name string
		cfg  bulkhead.Config
		want []string
	}{
		{"empty name", bulkhead.Config{MaxConcurrent: 1}, []string{"bulkhead: Name must not be empty"}},
		{"zero size", bulkhead.Config{Name: "batch"}, []string{`bulkhead "batch": MaxConcurrent must be >= 1, got 0`}},
		{"negative size", bulkhead.Config{Name: "batch", MaxConcurrent: -3}, []string{`bulkhead "batch": MaxConcurrent must be >= 1, got -3`}},
		{"negative wait", bulkhead.Config{Name: "batch", MaxConcurrent: 1, MaxWait: -time.Second}, []string{`bulkhead "batch": MaxWait must be >= 0, got -1s`}},
		{"everything wrong at once", bulkhead.Config{MaxWait: -time.Millisecond}, []string{
			"bulkhead: Name must not be empty",
			`bulkhead "(unnamed)": MaxConcurrent must be >= 1, got 0`,
			`bulkhead "(unnamed)": MaxWait must be >= 0, got -1ms`,
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := bulkhead.New(tc.cfg)
			require.Nil(t, b)
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestAccessors(t *testing.T) {
	b := mustNew(t, bulkhead.Config{Name: "batch", MaxConcurrent: 4, MaxWait: time.Second})
	require.Equal(t, "batch", b.Name())
	require.Equal(t, 4, b.MaxConcurrent())
	require.Equal(t, time.Second, b.MaxWait())
	require.Equal(t, 0, b.Active())
	require.Equal(t, 4, b.Available())
	require.False(t, b.IsFull())
	for range 4 {
		require.True(t, b.TryAcquire())
	}
	require.True(t, b.IsFull())
	require.Equal(t, 4, b.Active())
	require.Equal(t, 0, b.Available())
	for range 4 {
		b.Release()
	}
	require.Equal(t, 0, b.Active())
}

func TestFullErrorMessageAndMatching(t *testing.T) {
	b := mustNew(t, bulkhead.Config{Name: "batch", MaxConcurrent: 4})
	for range 4 {
		require.True(t, b.TryAcquire())
	}
	defer func() {
		for range 4 {
			b.Release()
		}
	}()
	ran := false
	err := b.Execute(context.Background(), func(context.Context) error { ran = true; return nil })
	require.False(t, ran, "fn must not run when the bulkhead is full")
	require.EqualError(t, err, `bulkhead "batch" is full (4/4)`)
	require.ErrorIs(t, err, bulkhead.ErrFull)
	var fe *bulkhead.FullError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, bulkhead.FullError{Name: "batch", Active: 4, Max: 4}, *fe)
}

func TestExecuteReturnsFnError(t *testing.T) {
	b := mustNew(t, bulkhead.Config{Name: "order", MaxConcurrent: 1})
	boom := errors.New("boom")
	err := b.Execute(context.Background(), func(context.Context) error { return boom })
	require.Same(t, boom, err)
	require.Equal(t, 0, b.Active(), "an error releases the slot")
	s := b.Stats()
	require.Equal(t, uint64(1), s.Accepted)
	require.Equal(t, uint64(1), s.Failed)
	require.Equal(t, uint64(0), s.Completed)
}

func TestExecutePassesContext(t *testing.T) {
	type key struct{}
	b := mustNew(t, bulkhead.Config{Name: "order", MaxConcurrent: 1})
	ctx := context.WithValue(context.Background(), key{}, "v")
	var got any
	require.NoError(t, b.Execute(ctx, func(ctx context.Context) error { got = ctx.Value(key{}); return nil }))
	require.Equal(t, "v", got)
}

func TestPanicReleasesSlotAndPropagates(t *testing.T) {
	b := mustNew(t, bulkhead.Config{Name: "batch", MaxConcurrent: 1})
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		_ = b.Execute(context.Background(), func(context.Context) error { panic("report exploded") })
	}()
	require.Equal(t, "report exploded", recovered, "the panic goes on after the release")
	require.Equal(t, 0, b.Active())
	require.Equal(t, uint64(1), b.Stats().Panicked)
	// The freed slot is usable again.
	require.NoError(t, b.Execute(context.Background(), func(context.Context) error { return nil }))
}

func TestCancelledContextDoesNotRun(t *testing.T) {
	b := mustNew(t, bulkhead.Config{Name: "order", MaxConcurrent: 1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	err := b.Execute(ctx, func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, ran)
	require.Equal(t, 0, b.Active())
}

func TestCancellationInsideFnReleases(t *testing.T) {
	b := mustNew(t, bulkhead.Config{Name: "order", MaxConcurrent: 1})
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- b.Execute(ctx, func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	<-started
	require.True(t, b.IsFull())
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Equal(t, 0, b.Active())
}

func TestMaxWaitTimesOut(t *testing.T) {
	b := mustNew(t, bulkhead.Config{Name: "search", MaxConcurrent: 1, MaxWait: 20 * time.Millisecond})
	require.True(t, b.TryAcquire())
	defer b.Release()
	start := time.Now()
	err := b.Execute(context.Background(), func(context.Context) error { return nil })
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
	require.ErrorIs(t, err, bulkhead.ErrFull)
	var fe *bulkhead.FullError
	require.ErrorAs(t, err, &fe)
	require.GreaterOrEqual(t, fe.Waited, 20*time.Millisecond)
	require.Nil(t, fe.Cause)
	require.Regexp(t, `^bulkhead "search" is full \(1/1\) after waiting \d+ms$`, err.Error())
	require.Equal(t, 0, b.Stats().Waiting, "a timed-out waiter leaves nothing behind")
	require.Equal(t, 1, b.Active())
}

func TestMaxWaitGetsFreedSlot(t *testing.T) {
	b := mustNew(t, bulkhead.Config{Name: "search", MaxConcurrent: 1, MaxWait: time.Minute})
	require.True(t, b.TryAcquire())
	done := make(chan error)
	go func() { done <- b.Execute(context.Background(), func(context.Context) error { return nil }) }()
	testwait.For(t, 10*time.Second, "the call to wait", func() bool { return b.Stats().Waiting == 1 })
	b.Release()
	require.NoError(t, <-done)
	require.Equal(t, 0, b.Active())
}

func TestWaiterCancelledLeavesNothingBehind(t *testing.T) {
	b := mustNew(t, bulkhead.Config{Name: "search", MaxConcurrent: 1, MaxWait: time.Minute})
	require.True(t, b.TryAcquire())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- b.Execute(ctx, func(context.Context) error { return nil }) }()
	testwait.For(t, 10*time.Second, "the call to wait", func() bool { return b.Stats().Waiting == 1 })
	cancel()
	err := <-done
	require.ErrorIs(t, err, bulkhead.ErrFull)
	require.ErrorIs(t, err, context.Canceled)
	require.Contains(t, err.Error(), `bulkhead "search" is full (1/1) after waiting`)
	require.Contains(t, err.Error(), "context canceled")
	require.Equal(t, 0, b.Stats().Waiting)
	b.Release()
	require.Equal(t, 0, b.Active(), "the cancelled waiter holds no slot")
	require.True(t, b.TryAcquire(), "and the slot it waited for is free for others")
	b.Release()
}

func TestWaitersFirstComeFirstServed(t *testing.T) {
	const waiters = 8
	b := mustNew(t, bulkhead.Config{Name: "batch", MaxConcurrent: 1, MaxWait: time.Minute})
	require.True(t, b.TryAcquire())

	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	gate := make(chan struct{})
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := b.Execute(context.Background(), func(context.Context) error {
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				<-gate
				return nil
			})
			require.NoError(t, err)
		}()
		// Start the next waiter only once this one is queued, so arrival
		// order is known.
		testwait.For(t, 10*time.Second, fmt.Sprintf("waiter %d to queue", i), func() bool { return b.Stats().Waiting == i+1 })
	}
	// The freed slot passes to the oldest waiter inside Release itself, so a
	// newcomer arriving right after cannot jump the queue.
	b.Release()
	require.False(t, b.TryAcquire(), "a freed slot goes to the oldest waiter, not to a newcomer")
	close(gate)
	wg.Wait()
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, order)
	require.Equal(t, 0, b.Active())
}

func TestReleaseWithoutAcquirePanics(t *testing.T) {
	b := mustNew(t, bulkhead.Config{Name: "batch", MaxConcurrent: 2})
	require.PanicsWithValue(t, `bulkhead "batch": Release called without a held slot`, b.Release)
	require.True(t, b.TryAcquire())
	b.Release()
	require.PanicsWithValue(t, `bulkhead "batch": Release called without a held slot`, b.Release,
		"releasing more than held panics")
}

func TestAcquireRelease(t *testing.T) {
	b := mustNew(t, bulkhead.Config{Name: "batch", MaxConcurrent: 1})
	require.NoError(t, b.Acquire(context.Background()))
	err := b.Acquire(context.Background())
	require.EqualError(t, err, `bulkhead "batch" is full (1/1)`)
	b.Release()
	require.Equal(t, 0, b.Active())
}

func TestDo(t *testing.T) {
	b := mustNew(t, bulkhead.Config{Name: "search", MaxConcurrent: 1})
	n, err := bulkhead.Do(context.Background(), b, func(context.Context) (int, error) { return 42, nil })
	require.NoError(t, err)
	require.Equal(t, 42, n)

	require.True(t, b.TryAcquire())
	n, err = bulkhead.Do(context.Background(), b, func(context.Context) (int, error) { return 7, nil })
	require.ErrorIs(t, err, bulkhead.ErrFull)
	require.Zero(t, n)
	b.Release()
}

// TestCapHoldsUnderConcurrency hammers a bulkhead from many goroutines and
// checks, from inside fn, that no more than MaxConcurrent run at once; that
// each call is either accepted or rejected with ErrFull; and that every
// Stats observation is consistent.
func TestCapHoldsUnderConcurrency(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    int
		maxWait time.Duration
	}{
		{"fail fast", 4, 0},
		{"bounded wait", 3, 200 * time.Microsecond},
		{"size one", 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const goroutines, calls = 64, 300
			b := mustNew(t, bulkhead.Config{Name: "batch", MaxConcurrent: tc.size, MaxWait: tc.maxWait})

			var inside, peak, ran, full, other atomic.Int64
			stop := make(chan struct{})
			var badObservation atomic.Value
			observerDone := make(chan struct{})
			go func() {
				defer close(observerDone)
				for {
					select {
					case <-stop:
						return
					default:
					}
					s := b.Stats()
					if s.Active+s.Available != s.Max || s.Active < 0 || s.Active > s.Max {
						badObservation.Store(fmt.Sprintf("%+v", s))
					}
					if a := b.Active(); a < 0 || a > tc.size {
						badObservation.Store(fmt.Sprintf("Active()=%d", a))
					}
				}
			}()

			var wg sync.WaitGroup
			for range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range calls {
						err := b.Execute(context.Background(), func(context.Context) error {
							n := inside.Add(1)
							for {
								p := peak.Load()
								if n <= p || peak.CompareAndSwap(p, n) {
									break
								}
							}
							ran.Add(1)
							inside.Add(-1)
							return nil
						})
						switch {
						case err == nil:
						case errors.Is(err, bulkhead.ErrFull):
							full.Add(1)
						default:
							other.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			close(stop)
			<-observerDone

			require.Nil(t, badObservation.Load(), "inconsistent observation")
			require.LessOrEqual(t, peak.Load(), int64(tc.size), "more than MaxConcurrent ran at once")
			require.Zero(t, other.Load(), "every call is accepted or rejected with ErrFull")
			require.Equal(t, int64(goroutines*calls), ran.Load()+full.Load())
			s := b.Stats()
			require.Equal(t, uint64(ran.Load()), s.Accepted)
			require.Equal(t, uint64(ran.Load()), s.Completed)
			require.Equal(t, uint64(full.Load()), s.Rejected)
			require.Equal(t, 0, s.Active)
			require.Equal(t, 0, s.Waiting)
			require.Positive(t, ran.Load())
		})
	}
}

func TestReleasedOnEveryPathUnderConcurrency(t *testing.T) {
	b := mustNew(t, bulkhead.Config{Name: "batch", MaxConcurrent: 3, MaxWait: time.Millisecond})
	boom := errors.New("boom")
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				ctx, cancel := context.WithCancel(context.Background())
				func() {
					defer func() { _ = recover() }()
					_ = b.Execute(ctx, func(ctx context.Context) error {
						switch (g + i) % 4 {
						case 0:
							return nil
						case 1:
							return boom
						case 2:
							panic("boom")
						default:
							cancel()
							<-ctx.Done()
							return ctx.Err()
						}
					})
				}()
				cancel()
			}
		}()
	}
	wg.Wait()
	s := b.Stats()
	require.Equal(t, 0, s.Active, "every path released its slot")
	require.Equal(t, 0, s.Waiting)
	require.Equal(t, s.Accepted, s.Completed+s.Failed+s.Panicked)
	require.Positive(t, s.Panicked)
	require.Positive(t, s.Failed)
}
