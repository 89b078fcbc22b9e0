package demo

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/queues"
)

// TestLimitLogMergesReads: the pool's log is read newest first at every
// refresh, overlapping the previous read; the act keeps each change once,
// oldest first, and none from before it began.
func TestLimitLogMergesReads(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC)
	ch := func(s int, from, to int) queues.AdaptiveChange {
		return queues.AdaptiveChange{At: t0.Add(time.Duration(s) * time.Second), From: from, To: to, Reason: "r"}
	}
	l := &limitLog{since: t0}
	l.add([]queues.AdaptiveChange{ch(2, 4, 2), ch(-5, 2, 4)}) // the second is AFTER's
	l.add([]queues.AdaptiveChange{ch(3, 2, 1), ch(2, 4, 2)})
	l.add(nil)
	operator := queues.AdaptiveChange{At: t0.Add(5 * time.Second), Reason: "an operator resized the pool (the adaptive limit waits for a reset)"}
	l.add([]queues.AdaptiveChange{ch(7, 1, 2), operator, ch(3, 2, 1), ch(2, 4, 2)})
	l.add([]queues.AdaptiveChange{ch(7, 1, 2), operator})
	require.Equal(t, []queues.AdaptiveChange{ch(2, 4, 2), ch(3, 2, 1), ch(7, 1, 2)}, l.changes)
	require.Equal(t, []queues.AdaptiveChange{operator}, l.notes, "an operator's entry is no change of the limit")
}

// TestOverLimitCountsStartsBeyondTheLimit: a start that finds more jobs
// inside than the limit in effect then is counted, one within limitGrace
// of a fall is not (its slot was granted before), and nothing passes
// max_size whatever the limit.
func TestOverLimitCountsStartsBeyondTheLimit(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	log := &limitLog{changes: []queues.AdaptiveChange{
		{At: at(1000), From: 4, To: 2}, // a fall
		{At: at(3000), From: 2, To: 1}, // and another
		{At: at(5000), From: 1, To: 3}, // a climb
	}}
	for _, tc := range []struct {
		name   string
		starts []rowStart
		over   int
	}{
		{"at the limit before the fall", []rowStart{{at(500), 4}}, 0},
		{"just after the fall, within the grace", []rowStart{{at(1000 + 100), 4}}, 0},
		{"after the fall and its grace", []rowStart{{at(1000 + 400), 3}}, 1},
		{"at the fallen limit", []rowStart{{at(2000), 2}, {at(4000), 1}}, 0},
		{"beyond the limit of 1", []rowStart{{at(4000), 2}}, 1},
		{"the climb allows more at once", []rowStart{{at(5000), 3}}, 0},
		{"never beyond max_size", []rowStart{{at(500), 5}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, most, over := overLimit(tc.starts, log, 4, 4)
			require.Equal(t, len(tc.starts), n)
			require.Equal(t, tc.over, over)
			require.Positive(t, most)
		})
	}
}

// TestRecorderKeepsTheWatchedRowsStarts: every start of the watched row
// is kept with the jobs inside then, and the orders are counted enqueued
// and completed, in three parts around the slowdown.
func TestRecorderKeepsTheWatchedRowsStarts(t *testing.T) {
	t.Parallel()
	rec := newRecorder(time.Second, nil)
	rec.watch = "batch"
	var n int
	require.NoError(t, rec.enqueueOrder(func() (string, error) { n++; return "o1", nil }))
	rec.startFlood()
	require.NoError(t, rec.enqueueOrder(func() (string, error) { n++; return "o2", nil }))
	rec.endFlood()
	require.NoError(t, rec.enqueueOrder(func() (string, error) { n++; return "o3", nil }))

	release := make(chan struct{})
	inside := make(chan struct{}, 2)
	hold := func(t *testing.T, id string) error {
		return rec.observe(t.Context(), job{id: id, queue: "q", lastTry: true}, []string{"batch"}, asynq.NewTask("report:run", nil), asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
			inside <- struct{}{}
			<-release
			return nil
		}))
	}
	done := make(chan error, 2)
	go func() { done <- hold(t, "r1") }()
	<-inside
	go func() { done <- hold(t, "r2") }()
	<-inside
	close(release)
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	starts := rec.watchedStarts()
	require.Len(t, starts, 2)
	require.Equal(t, 1, starts[0].inside)
	require.Equal(t, 2, starts[1].inside)

	for _, id := range []string{"o1", "o2", "o3"} {
		require.NoError(t, rec.observe(t.Context(), job{id: id, queue: "q", lastTry: true}, []string{"order"}, asynq.NewTask("order:create", nil), asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })))
	}
	enqueued, completed := rec.orderCount()
	require.Equal(t, 3, enqueued)
	require.Equal(t, 3, completed)
	parts := rec.orderParts()
	require.Equal(t, []int{1, 1, 1}, []int{parts[0].N, parts[1].N, parts[2].N}, "before, during and after")
}

// A higher tier starting after a lower one is an inversion, unless the two
// starts are one gate step apart (their handlers may run in either order).
func TestInversions(t *testing.T) {
	tiers := []string{"regulatory", "close", "management"}
	at := func(tier string, ms int) ReportStart {
		return ReportStart{Tier: tier, At: time.Duration(ms) * time.Millisecond}
	}
	require.Equal(t, 0, inversions([]ReportStart{at("regulatory", 0), at("close", 3000), at("management", 6000)}, tiers))
	require.Equal(t, 0, inversions([]ReportStart{at("close", 7000), at("management", 7001), at("close", 7010)}, tiers), "one step")
	require.Equal(t, 1, inversions([]ReportStart{at("management", 7000), at("close", 7200)}, tiers))
	require.Equal(t, 2, inversions([]ReportStart{at("management", 7000), at("close", 7200), at("regulatory", 9000)}, tiers))
}
