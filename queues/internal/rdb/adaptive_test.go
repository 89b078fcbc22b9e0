package rdb

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testwait"
)

// adaptiveTest is a pool of 6 whose limit may fall to 2, decided every
// 50 ms of Redis's clock.
var adaptiveTest = AdaptiveParams{Window: 50 * time.Millisecond, Min: 2, Max: 6, Configured: 6, Tolerance: 1.5}

// decide ticks with s, then with nothing until a tick decides on the
// window s went into, and returns that decision.
func decide(t *testing.T, a Adaptive, s AdaptiveSample) AdaptiveDecision {
	t.Helper()
	ctx := context.Background()
	_, err := a.Tick(ctx, adaptiveTest, s)
	require.NoError(t, err)
	var d AdaptiveDecision
	testwait.For(t, 5*time.Second, "a decision on the window", func() bool {
		var err error
		d, err = a.Tick(ctx, adaptiveTest, AdaptiveSample{})
		require.NoError(t, err)
		return d.Sample > 0 || d.Changed
	})
	return d
}

func init() {
	scriptCases = append(scriptCases,
		scriptCase{script: "adaptive_tick", name: "the limit falls with slow jobs or long waits, climbs when full, never past its bounds", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			a := NewAdaptive(b.RC, b.KS, "batch")
			d := decide(t, a, AdaptiveSample{Jobs: 10, Work: 100 * time.Millisecond})
			require.Equal(t, 6, d.Limit, "the first window sets the baseline")
			require.Equal(t, 10*time.Millisecond, d.Baseline)
			size, set, err := NewPools(b.RC, b.KS).Size(ctx, "batch")
			require.NoError(t, err)
			require.True(t, set)
			require.Equal(t, 6, size, "the limit is the size the gate reads")

			d = decide(t, a, AdaptiveSample{Jobs: 4, Work: 200 * time.Millisecond})
			require.True(t, d.Changed)
			require.Equal(t, 6, d.From)
			require.Equal(t, 3, d.Limit, "at most halved")
			require.Equal(t, "jobs took 50ms against a baseline of 10ms", d.Reason)
			size, _, err = NewPools(b.RC, b.KS).Size(ctx, "batch")
			require.NoError(t, err)
			require.Equal(t, 3, size)

			d = decide(t, a, AdaptiveSample{Jobs: 4, Work: 200 * time.Millisecond})
			require.Equal(t, 2, d.Limit, "never below min")

			// Back to 10 ms, the pool full (its slots busy on average in
			// the window: 2 slots × 50 ms of work per 50 ms).
			d = decide(t, a, AdaptiveSample{Jobs: 10, Work: 100 * time.Millisecond})
			require.True(t, d.Changed)
			require.Equal(t, 3, d.Limit, "2 + √2, rounded")
			require.Contains(t, d.Reason, "within 1.5x their baseline")

			// Jobs that waited most of their time for their dependency: a
			// quarter off each window (3.41 -> 2.56 -> 2).
			wait := AdaptiveSample{Jobs: 10, Work: 40 * time.Millisecond, Wait: 60 * time.Millisecond}
			d = decide(t, a, wait)
			require.Equal(t, "jobs waited 6.0ms of their 10ms for their dependencies", d.Reason)
			require.Equal(t, 3, d.Limit)
			require.False(t, d.Changed)
			d = decide(t, a, wait)
			require.True(t, d.Changed)
			require.Equal(t, 2, d.Limit)

			// A window nobody ticked in to decide is counted with the next.
			_, err = a.Tick(ctx, adaptiveTest, AdaptiveSample{Jobs: 2, Work: 20 * time.Millisecond})
			require.NoError(t, err)
			start, err := b.RC.Time(ctx).Result()
			require.NoError(t, err)
			testwait.For(t, 5*time.Second, "two windows to pass", func() bool {
				now, err := b.RC.Time(ctx).Result()
				require.NoError(t, err)
				return now.Sub(start) > 2*adaptiveTest.Window
			})
			d, err = a.Tick(ctx, adaptiveTest, AdaptiveSample{})
			require.NoError(t, err)
			require.Equal(t, 10*time.Millisecond, d.Sample, "the skipped window's jobs decided on")

			batch := NewPools(b.RC, b.KS).Batch()
			read := batch.Adaptive("batch", 10)
			require.NoError(t, batch.Exec(ctx))
			s, err := read.Result()
			require.NoError(t, err)
			require.Equal(t, 2, s.Limit)
			require.Equal(t, int64(4), s.ChangeCount)
			require.Len(t, s.Changes, 4)
			require.Equal(t, AdaptiveChange{At: s.Changes[0].At, From: 3, To: 2, Reason: d.Reason}, s.Changes[0], "newest first")
		}},
		scriptCase{script: "adaptive_override", name: "an operator's size holds the limit off until reset", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			a := NewAdaptive(b.RC, b.KS, "batch")
			decide(t, a, AdaptiveSample{Jobs: 10, Work: 100 * time.Millisecond})
			require.NoError(t, a.Override(ctx, 5))
			d := decide(t, a, AdaptiveSample{Jobs: 4, Work: 200 * time.Millisecond})
			require.True(t, d.Operator)
			require.Equal(t, 3, d.Limit, "the limit still moves")
			size, _, err := NewPools(b.RC, b.KS).Size(ctx, "batch")
			require.NoError(t, err)
			require.Equal(t, 5, size, "the operator's size holds")

			require.NoError(t, a.Override(ctx, 0))
			size, _, err = NewPools(b.RC, b.KS).Size(ctx, "batch")
			require.NoError(t, err)
			require.Equal(t, 3, size, "the reset gives the size back to the limit at once")

			require.NoError(t, a.Clear(ctx))
			_, set, err := NewPools(b.RC, b.KS).Size(ctx, "batch")
			require.NoError(t, err)
			require.False(t, set, "cleared with the limit")

			// A process whose config does not make the pool adaptive
			// resizes it, then resets it: the limit waits, then holds again.
			d = decide(t, a, AdaptiveSample{Jobs: 10, Work: 100 * time.Millisecond})
			require.False(t, d.Operator)
			require.NoError(t, NewPools(b.RC, b.KS).SetSize(ctx, "batch", 5))
			d, err = a.Tick(ctx, adaptiveTest, AdaptiveSample{})
			require.NoError(t, err)
			require.True(t, d.Operator, "a size the limit did not write is an operator's")
			size, _, err = NewPools(b.RC, b.KS).Size(ctx, "batch")
			require.NoError(t, err)
			require.Equal(t, 5, size)
			require.NoError(t, NewPools(b.RC, b.KS).ResetSize(ctx, "batch"))
			d, err = a.Tick(ctx, adaptiveTest, AdaptiveSample{})
			require.NoError(t, err)
			require.False(t, d.Operator, "the operator's size deleted: a reset")
			size, _, err = NewPools(b.RC, b.KS).Size(ctx, "batch")
			require.NoError(t, err)
			require.Equal(t, d.Limit, size, "the limit writes the size again")

			// Narrower bounds (a reload) hold at the next tick.
			narrow := adaptiveTest
			narrow.Max = 2
			d, err = a.Tick(ctx, narrow, AdaptiveSample{})
			require.NoError(t, err)
			require.Equal(t, 2, d.Limit)
			size, _, err = NewPools(b.RC, b.KS).Size(ctx, "batch")
			require.NoError(t, err)
			require.Equal(t, 2, size, "clamped at once, whoever decides")

			require.NoError(t, a.Clear(ctx))
			// A pool resized before it became adaptive keeps the size.
			require.NoError(t, NewPools(b.RC, b.KS).SetSize(ctx, "batch", 4))
			d = decide(t, a, AdaptiveSample{Jobs: 10, Work: 100 * time.Millisecond})
			require.True(t, d.Operator)
			size, _, err = NewPools(b.RC, b.KS).Size(ctx, "batch")
			require.NoError(t, err)
			require.Equal(t, 4, size)
			require.NoError(t, a.Clear(ctx))
			size, _, err = NewPools(b.RC, b.KS).Size(ctx, "batch")
			require.NoError(t, err)
			require.Equal(t, 4, size, "an operator's size outlives the limit's state")
		}},
	)
}
