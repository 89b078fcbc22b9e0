package queues_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// resizeBound is what Resize promises: every process follows within 1.5
// poll intervals (10 ms here); the issue asks for 5 s. The test allows 5 s
// and logs what it measured.
const resizeBound = 5 * time.Second

// resizeGrace covers a job whose slot was granted just before a resize
// took effect but whose handler records its start just after: the slot
// and the record are two steps.
const resizeGrace = 100 * time.Millisecond

// shrinkGrace is how long after a shrink (a resize down, an adaptive
// fall, a reset below an operator's size) a job may still start at the
// old size: a process sees the shrink at its next reply, and until then
// it may hand a slot freed here on to its own waiting job
// (docs/CLUSTER.md, "A slot handed on within a process, on a view one
// reply old"), which keeps the count where it was. The bound documented
// there is one hand-off per process, not a time: the hand-off's op and
// the waiting jobs' questions (every 100 ms) bring the reply, and under a
// full -race CI run that reply came late on both Redises (CI saw a start
// at the old size past 100 ms, first on the embedded Redis, then on a
// real one), so the grace is a second.
const shrinkGrace = time.Second

// startsSince returns how many jobs started after since, and the most
// running at once (seen inside the handlers) at any of those starts.
func (c *cluster) startsSince(since time.Time) (n, most int) {
	c.obs.mu.Lock()
	defer c.obs.mu.Unlock()
	for i, at := range c.obs.startedAt {
		if at.After(since) {
			n++
			most = max(most, c.obs.insideAt[i])
		}
	}
	return n, most
}

// waitInside waits until a job starts after since with want jobs running
// (itself included), and returns when it did.
func (c *cluster) waitInside(since time.Time, want int) time.Time {
	return c.waitInsideFor(since, want, resizeBound)
}

// waitInsideFor is waitInside with a deadline of its own.
func (c *cluster) waitInsideFor(since time.Time, want int, timeout time.Duration) time.Time {
	var at time.Time
	testwait.For(c.t, timeout, fmt.Sprintf("%d jobs running at once", want), func() bool {
		c.obs.mu.Lock()
		defer c.obs.mu.Unlock()
		for i, t := range c.obs.startedAt {
			if t.After(since) && c.obs.insideAt[i] == want {
				at = t
				return true
			}
		}
		return false
	})
	return at
}

// TestResizeUnderLoad: three runners serve a cluster-scoped pool of 2
// (max_size 6) with a backlog. Resized to 6, the jobs running at once,
// counted inside the handlers, reach 6 within the bound and never pass it;
// resized to 1, no job starts until fewer than 1 run (no running job is
// cut short), then never more than 1; reset, the configured 2 again.
func TestResizeUnderLoad(t *testing.T) {
	c := newCluster(t, 2, nil)
	c.cfg.Pools[0].MaxSize = 6
	c.obs.size = 6 // a violation is more than max_size at any moment
	admin, err := queues.NewClient(c.r.Client, c.cfg)
	require.NoError(t, err)
	ctx := context.Background()
	// starts is how many starts each phase watches.
	work, total, starts := 30*time.Millisecond, 1500, 20
	if c.r.Mini != nil {
		// The embedded Redis, under -race, serves about 30 jobs a second
		// to the three runners: longer jobs keep 6 busy at once.
		work, total, starts = 500*time.Millisecond, 200, 6
	}
	for i := range total {
		c.enqueue(clusterJob{Seq: i, Work: work})
	}
	c.start(3)
	began := time.Now()
	c.waitInside(began, 2)
	testwait.For(t, 20*time.Second, "jobs to start at size 2", func() bool { n, _ := c.startsSince(began); return n >= starts })
	_, most := c.startsSince(began)
	require.Equal(t, 2, most, "at the configured size 2")

	resized := time.Now()
	require.NoError(t, admin.Resize(ctx, "batch", 6))
	grown := c.waitInside(resized, 6).Sub(resized)
	size, err := admin.PoolSize(ctx, "batch")
	require.NoError(t, err)
	require.Equal(t, queues.PoolSize{Configured: 2, Effective: 6, Resized: true, Max: 6}, size)

	require.NoError(t, admin.Resize(ctx, "batch", 1))
	shrunk := time.Now()
	testwait.For(t, 20*time.Second, "jobs to start at size 1", func() bool {
		n, _ := c.startsSince(shrunk.Add(shrinkGrace))
		return n >= starts/2
	})
	_, most = c.startsSince(shrunk.Add(shrinkGrace))
	require.Equal(t, 1, most, "after the shrink to 1, a job started while others still ran")

	require.NoError(t, admin.ResetSize(ctx, "batch"))
	reset := time.Now()
	back := c.waitInside(reset, 2).Sub(reset)
	testwait.For(t, 20*time.Second, "jobs to start after the reset", func() bool {
		n, _ := c.startsSince(reset.Add(resizeGrace))
		return n >= starts
	})
	_, most = c.startsSince(reset.Add(resizeGrace))
	require.Equal(t, 2, most, "after the reset, the configured size")

	c.obs.mu.Lock()
	peak, violations := c.obs.peak, c.obs.violations
	c.obs.mu.Unlock()
	require.Zero(t, violations, "more than max_size ran at once")
	require.Equal(t, 6, peak)
	t.Logf("3 processes: resized 2 -> 6 took effect in %s, 6 -> 1 at once (no start until under 1), reset to 2 in %s (bound %s)",
		grown.Round(time.Millisecond), back.Round(time.Millisecond), resizeBound)
}

// TestResizeRefused: a resize out of bounds, of a pool scoped per process
// or of an unknown pool is refused, and the size stays.
func TestResizeRefused(t *testing.T) {
	h := newHarness(t,
		queues.PoolConfig{Name: "batch", Size: 2, MaxSize: 4, JobTypes: []string{"report:run"}},
		queues.PoolConfig{Name: "order", Size: 3, JobTypes: []string{"order:create"}, Scope: queues.ScopeProcess})
	c := h.client
	ctx := context.Background()
	require.NoError(t, c.Resize(ctx, "batch", 3))
	for _, tc := range []struct {
		name, pool string
		size       int
		msg        string
	}{
		{"zero", "batch", 0, `pool "batch": size must be from 1 to its max_size 4, got 0`},
		{"above max_size", "batch", 5, `pool "batch": size must be from 1 to its max_size 4, got 5`},
		{"process scope", "order", 2, `pool "order" is scoped per process`},
		{"unknown pool", "nope", 2, `unknown pool "nope"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Resize(ctx, tc.pool, tc.size)
			require.ErrorIs(t, err, queues.ErrInvalidResize)
			require.ErrorContains(t, err, tc.msg)
			size, err := c.PoolSize(ctx, "batch")
			require.NoError(t, err)
			require.Equal(t, 3, size.Effective, "nothing changed")
		})
	}
	require.ErrorIs(t, c.ResetSize(ctx, "order"), queues.ErrInvalidResize)
	require.NoError(t, c.ResetSize(ctx, "batch"))
	size, err := c.PoolSize(ctx, "batch")
	require.NoError(t, err)
	require.Equal(t, queues.PoolSize{Configured: 2, Effective: 2, Max: 4}, size)
	size, err = c.PoolSize(ctx, "order")
	require.NoError(t, err)
	require.Equal(t, queues.PoolSize{Configured: 3, Effective: 3, Max: 3}, size)
}

// TestResizeKeepsRoomBeyondReservations: a pool with reserved slots may
// not be resized to its reservations or fewer (its lower tiers would get
// no slot); nothing changes.
func TestResizeKeepsRoomBeyondReservations(t *testing.T) {
	h := newHarness(t, queues.PoolConfig{Name: "batch", Size: 4, MaxSize: 6, JobTypes: []string{"report:run"},
		Tiers: []string{"regulatory", "close", "adhoc"}, Reserved: map[string]int{"regulatory": 1, "close": 1}})
	ctx := context.Background()
	err := h.client.Resize(ctx, "batch", 2)
	require.ErrorIs(t, err, queues.ErrInvalidResize)
	require.ErrorContains(t, err, `pool "batch": size must be more than its 2 reserved slots (the lower tiers would get none), got 2`)
	size, err := h.client.PoolSize(ctx, "batch")
	require.NoError(t, err)
	require.Equal(t, queues.PoolSize{Configured: 4, Effective: 4, Max: 6}, size, "nothing changed")
	require.NoError(t, h.client.Resize(ctx, "batch", 3))
}
