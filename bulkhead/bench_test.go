package bulkhead_test

import (
	"context"
	"sync/atomic"
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
// bulkhead full are rejected (fail fast), as in production; the share of
// rejected calls is reported as rejected/op, and since a rejection costs far
// less than a run, the wall time per accepted call as ns/accepted.
func BenchmarkContended(b *testing.B) {
	ctx := context.Background()
	const goroutines = 8
	parallel := func(b *testing.B, body func() bool) {
		b.SetParallelism((goroutines + 1) / max(1, procs()))
		b.ReportAllocs()
		var rejected atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			n := int64(0)
			for pb.Next() {
				if !body() {
					n++
				}
			}
			rejected.Add(n)
		})
		accepted := int64(b.N) - rejected.Load()
		b.ReportMetric(float64(rejected.Load())/float64(b.N), "rejected/op")
		if accepted > 0 {
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(accepted), "ns/accepted")
		}
	}
	b.Run("baseline=chan", func(b *testing.B) {
		s := make(chanSem, 4)
		parallel(b, func() bool { return s.execute(ctx, noop) })
	})
	b.Run("baseline=x-sync-semaphore", func(b *testing.B) {
		s := semaphore.NewWeighted(4)
		parallel(b, func() bool {
			if !s.TryAcquire(1) {
				return false
			}
			_ = noop(ctx)
			s.Release(1)
			return true
		})
	})
	b.Run("bulkhead=Execute", func(b *testing.B) {
		bh, _ := bulkhead.New(bulkhead.Config{Name: "bench", MaxConcurrent: 4})
		parallel(b, func() bool { return bh.Execute(ctx, noop) == nil })
	})
}
