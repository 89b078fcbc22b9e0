package bulkhead_test

import (
	"context"
	"testing"

	"golang.org/x/sync/semaphore"

	"github.com/lci-labs/compartment/bulkhead"
)

// The benchmarks run our bulkhead beside two baselines in the same run: a bare
// buffered-channel semaphore (the least a slot can cost) and
// golang.org/x/sync/semaphore. See docs/BENCHMARKS.md for the command and a
// recorded run.

func noop(context.Context) error { return nil }

// chanSem is the bare baseline: take a token or fail, run, give it back.
type chanSem chan struct{}

func (s chanSem) execute(ctx context.Context, fn func(context.Context) error) bool {
	select {
	case s <- struct{}{}:
	default:
		return false
	}
	defer func() { <-s }()
	_ = fn(ctx)
	return true
}

func BenchmarkUncontended(b *testing.B) {
	ctx := context.Background()
	b.Run("baseline=chan", func(b *testing.B) {
		s := make(chanSem, 4)
		b.ReportAllocs()
		for b.Loop() {
			s.execute(ctx, noop)
		}
	})
	b.Run("baseline=x-sync-semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(4)
		b.ReportAllocs()
		for b.Loop() {
			if s.TryAcquire(1) {
				_ = noop(ctx)
				s.Release(1)
			}
		}
	})
	b.Run("bulkhead=Execute", func(b *testing.B) {
		bh, _ := bulkhead.New(bulkhead.Config{Name: "bench", MaxConcurrent: 4})
		b.ReportAllocs()
		for b.Loop() {
			_ = bh.Execute(ctx, noop)
		}
	})
	b.Run("bulkhead=TryAcquire", func(b *testing.B) {
		bh, _ := bulkhead.New(bulkhead.Config{Name: "bench", MaxConcurrent: 4})
		b.ReportAllocs()
		for b.Loop() {
			if bh.TryAcquire() {
				_ = noop(ctx)
				bh.Release()
			}
		}
	})
}

// BenchmarkContended runs 8 goroutines against 4 slots. Calls that find the
// bulkhead full are rejected (fail fast), as in production.
func BenchmarkContended(b *testing.B) {
	ctx := context.Background()
	const goroutines = 8
	parallel := func(b *testing.B, body func()) {
		b.SetParallelism((goroutines + 1) / max(1, procs()))
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				body()
			}
		})
	}
	b.Run("baseline=chan", func(b *testing.B) {
		s := make(chanSem, 4)
		parallel(b, func() { s.execute(ctx, noop) })
	})
	b.Run("baseline=x-sync-semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(4)
		parallel(b, func() {
			if s.TryAcquire(1) {
				_ = noop(ctx)
				s.Release(1)
			}
		})
	})
	b.Run("bulkhead=Execute", func(b *testing.B) {
		bh, _ := bulkhead.New(bulkhead.Config{Name: "bench", MaxConcurrent: 4})
		parallel(b, func() { _ = bh.Execute(ctx, noop) })
	})
}
