package queues_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// budgetConfig is three pools on a database of 20 connections: order 8×1,
// search 4×2 and an adaptive batch pool that may grow to 4, claiming 4×1:
// 20 in all, the whole budget.
func budgetConfig(t *testing.T, ns string) queues.Config {
	return queues.Config{
		Namespace:    ns,
		Tiers:        testPolicy(t),
		Logger:       slog.New(slog.DiscardHandler),
		Dependencies: []queues.Dependency{{Name: "reports-db", Capacity: 20}, {Name: "mail-api", Capacity: 5}},
		Pools: []queues.PoolConfig{
			{Name: "order", Size: 8, MaxSize: 10, JobTypes: []string{"order:create"}, Uses: map[string]int{"reports-db": 1}},
			{Name: "search", Size: 4, MaxSize: 6, JobTypes: []string{"search:index"}, Uses: map[string]int{"reports-db": 2}},
			{Name: "batch", Size: 2, MaxSize: 4, JobTypes: []string{"report:run"}, Uses: map[string]int{"reports-db": 1},
				Adaptive: &queues.AdaptiveConfig{Min: 1}},
		},
	}
}

// TestDependencyBudgetAtLoad: pools that claim more of a dependency than
// its capacity are refused with every number and each pool's share,
// beside the config's other problems; allow_overbooking lets them load.
func TestDependencyBudgetAtLoad(t *testing.T) {
	cfg := budgetConfig(t, "budget-load")
	require.NoError(t, cfg.Validate(), "20 of 20 fits")

	cfg.Pools[1].Size = 5
	cfg.Pools[0].Uses["mail-api"] = 1
	cfg.Pools = append(cfg.Pools, queues.PoolConfig{Name: "bad", Size: 0, JobTypes: []string{"bad:job"}})
	err := cfg.Validate()
	var ce *queues.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Contains(t, ce.Problems,
		`dependency "reports-db": the pools claim 22 but its capacity is 20: order 8×1 = 8 (size) + search 5×2 = 10 (size) + batch 4×1 = 4 (adaptive up to max_size); shrink the pools, lower their uses, raise the capacity, or set allow_overbooking`)
	require.Contains(t, ce.Problems,
		`dependency "mail-api": the pools claim 8 but its capacity is 5: order 8×1 = 8 (size); shrink the pools, lower their uses, raise the capacity, or set allow_overbooking`)
	require.Contains(t, ce.Problems, `pool "bad": size must be >= 1, got 0`, "named with the others")

	cfg.Pools = cfg.Pools[:3]
	cfg.AllowOverbooking = true
	require.NoError(t, cfg.Validate(), "allow_overbooking lifts the budgets")
}

// TestDependencyConfigProblems: a pool using an unknown dependency, a use
// below 1, a per-process pool with uses, a capacity of zero or less, a
// dependency listed twice or badly named: each named, all at once.
func TestDependencyConfigProblems(t *testing.T) {
	cfg := budgetConfig(t, "budget-problems")
	cfg.Dependencies = append(cfg.Dependencies,
		queues.Dependency{Name: "zero", Capacity: 0}, queues.Dependency{Name: "neg", Capacity: -3},
		queues.Dependency{Name: "mail-api", Capacity: 2}, queues.Dependency{Name: "Bad Name", Capacity: 1})
	cfg.Pools[0].Uses = map[string]int{"reports-db": 1, "nosuch": 1}
	cfg.Pools[1].Uses = map[string]int{"reports-db": 0}
	cfg.Pools = append(cfg.Pools, queues.PoolConfig{Name: "local", Size: 2, JobTypes: []string{"local:job"}, Scope: queues.ScopeProcess,
		Uses: map[string]int{"reports-db": 1}})
	err := cfg.Validate()
	var ce *queues.ConfigError
	require.ErrorAs(t, err, &ce)
	for _, want := range []string{
		`pool "order": uses: unknown dependency "nosuch" (dependencies: ["reports-db" "mail-api" "zero" "neg" "mail-api" "Bad Name"])`,
		`pool "search": uses: "reports-db" must be >= 1, got 0`,
		`pool "local": uses needs scope: cluster (a per-process pool runs its size in every worker process, so its claim on a dependency grows with the number of workers)`,
		`dependency "zero": capacity must be >= 1, got 0`,
		`dependency "neg": capacity must be >= 1, got -3`,
		`dependency "mail-api": listed twice`,
		`dependency "Bad Name": name must match ^[a-z0-9][a-z0-9_-]{0,62}$`,
	} {
		require.Contains(t, ce.Problems, want, fmt.Sprintf("all problems: %q", ce.Problems))
	}
}

// TestDependencyBudgetAtResize: a resize that would take the pools past a
// dependency's capacity is refused with the numbers and changes nothing;
// one that fits goes through, and the budget then counts it, at the next
// resize and at a reload; an operator's resize of an adaptive pool, which
// claims its max_size anyway, always fits.
func TestDependencyBudgetAtResize(t *testing.T) {
	r := testredis.New(t)
	cfg := budgetConfig(t, r.Namespace(t))
	c, err := queues.NewClient(r.Client, cfg)
	require.NoError(t, err)
	ctx := context.Background()

	err = c.Resize(ctx, "order", 9)
	require.ErrorIs(t, err, queues.ErrOverBudget)
	require.EqualError(t, err, `resize pool "order" to 9: over a dependency's budget: dependency "reports-db": the pools claim 21 but its capacity is 20: order 9×1 = 9 (size) + search 4×2 = 8 (size) + batch 4×1 = 4 (adaptive up to max_size); shrink the pools, lower their uses, raise the capacity, or set allow_overbooking`)
	s, err := c.PoolSize(ctx, "order")
	require.NoError(t, err)
	require.Equal(t, queues.PoolSize{Configured: 8, Effective: 8, Max: 10}, s, "nothing changed")

	require.NoError(t, c.Resize(ctx, "search", 3), "shrinking frees 2")
	require.NoError(t, c.Resize(ctx, "order", 10), "which order takes")
	err = c.Resize(ctx, "search", 4)
	require.ErrorIs(t, err, queues.ErrOverBudget)
	require.ErrorContains(t, err, `the pools claim 22 but its capacity is 20: order 10×1 = 10 (size) + search 4×2 = 8 (size) + batch 4×1 = 4`)
	err = c.ResetSize(ctx, "search")
	require.ErrorIs(t, err, queues.ErrOverBudget, "a reset to the configured size is checked too")
	require.NoError(t, c.Resize(ctx, "batch", 3), "an adaptive pool claims its max_size already")

	// A reload that grows search is checked against the sizes in effect:
	// order's 10 set by the operator.
	next := budgetConfig(t, cfg.Namespace)
	next.Pools[1].Size = 3
	next.Pools[2].Adaptive = nil // batch claims its size in effect from now on
	next.Pools[2].Uses["reports-db"] = 2
	require.NoError(t, next.Validate(), "at the configured sizes, 8 + 3×2 + 2×2 fits")
	_, err = c.Reconfigure(ctx, next)
	var ce *queues.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, []string{`with the sizes in effect: dependency "reports-db": the pools claim 22 but its capacity is 20: order 10×1 = 10 (size) + search 3×2 = 6 (size) + batch 3×2 = 6 (size); shrink the pools, lower their uses, raise the capacity, or set allow_overbooking`}, ce.Problems)

	require.NoError(t, c.ResetSize(ctx, "order"))
	_, err = c.Reconfigure(ctx, next)
	require.NoError(t, err, "8 + 3×2 + 3×2 fits")
	s, err = c.PoolSize(ctx, "batch")
	require.NoError(t, err)
	require.Equal(t, queues.PoolSize{Configured: 2, Effective: 3, Resized: true, Max: 4}, s, "the operator's size of the pool, adaptive no more, stays")
}

// TestDependencyHandle: a handler takes its pool's share of a dependency
// from the engine; status shows what the running jobs hold against the
// capacity; a pool without the dependency gets ErrNoDependency; a job
// holds its share once at a time.
func TestDependencyHandle(t *testing.T) {
	r := testredis.New(t)
	cfg := budgetConfig(t, r.Namespace(t))
	cfg.ShutdownTimeout = 5 * time.Second
	release := make(chan struct{})
	var mu sync.Mutex
	var units, capacity []int
	var second, missing error
	handlers := queues.NewHandlers()
	handlers.HandleFunc("search:index", func(ctx context.Context, _ *asynq.Task) error {
		dep, err := queues.DependencyOf(ctx, "reports-db")
		if err != nil {
			return err
		}
		done, err := dep.Acquire(ctx)
		if err != nil {
			return err
		}
		defer done()
		_, err2 := dep.Acquire(ctx)
		_, err3 := queues.DependencyOf(ctx, "mail-api")
		mu.Lock()
		units, capacity = append(units, dep.Units()), append(capacity, dep.Capacity())
		second, missing = err2, err3
		mu.Unlock()
		<-release
		return nil
	})
	for _, jt := range []string{"order:create", "report:run"} {
		handlers.HandleFunc(jt, noop)
	}
	cfg.Handlers = handlers
	c, err := queues.NewClient(r.Client, cfg)
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	stopped := false
	defer func() {
		if !stopped {
			close(release)
			_ = c.Stop(context.Background())
		}
	}()
	for range 3 {
		_, err := c.Enqueue(context.Background(), "search:index", []byte(`{}`), queues.EnqueueOptions{})
		require.NoError(t, err)
	}
	testwait.For(t, 20*time.Second, "3 jobs holding their share", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(units) == 3
	})
	st, err := c.Stats(context.Background())
	require.NoError(t, err)
	require.Len(t, st.Dependencies, 2)
	d := st.Dependencies[0]
	require.Equal(t, "reports-db", d.Name)
	require.Equal(t, 20, d.Capacity)
	require.Equal(t, int64(8+8+4), d.Claimed)
	require.Equal(t, int64(6), d.InUse, "3 running search jobs × 2")
	require.Equal(t, []queues.DependencyUse{
		{Pool: "order", Units: 1, Claimed: 8},
		{Pool: "search", Units: 2, Claimed: 8, InUse: 6, HeldHere: 6},
		{Pool: "batch", Units: 1, Claimed: 4},
	}, d.Pools)

	mu.Lock()
	require.Equal(t, []int{2, 2, 2}, units)
	require.Equal(t, []int{20, 20, 20}, capacity)
	require.EqualError(t, second, `dependency "reports-db": this job already holds its 2 (release them first)`)
	require.True(t, errors.Is(missing, queues.ErrNoDependency))
	require.EqualError(t, missing, `no such dependency for this pool: "mail-api": pool "search" uses ["reports-db"]`)
	mu.Unlock()
	_, err = queues.DependencyOf(context.Background(), "reports-db")
	require.ErrorIs(t, err, queues.ErrNoDependency)

	close(release)
	stopped = true
	require.NoError(t, c.Stop(context.Background()))
	st, err = c.Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(0), st.Dependencies[0].Pools[1].HeldHere, "released")
}

// TestDependencyAcquireWaitsWhenOverbooked: with allow_overbooking, jobs
// beyond the dependency's capacity wait in Acquire until units are
// released, so the capacity holds inside the handlers.
func TestDependencyAcquireWaitsWhenOverbooked(t *testing.T) {
	r := testredis.New(t)
	cfg := queues.Config{
		Namespace: r.Namespace(t), Tiers: testPolicy(t), Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: 5 * time.Second,
		Dependencies:     []queues.Dependency{{Name: "api", Capacity: 2}},
		AllowOverbooking: true,
		Pools: []queues.PoolConfig{{Name: "calls", Size: 5, JobTypes: []string{"call"}, PollInterval: 10 * time.Millisecond,
			Uses: map[string]int{"api": 1}}},
	}
	var mu sync.Mutex
	inside, peak, done := 0, 0, 0
	handlers := queues.NewHandlers()
	handlers.HandleFunc("call", func(ctx context.Context, _ *asynq.Task) error {
		dep, err := queues.DependencyOf(ctx, "api")
		if err != nil {
			return err
		}
		release, err := dep.Acquire(ctx)
		if err != nil {
			return err
		}
		mu.Lock()
		inside++
		peak = max(peak, inside)
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		inside--
		done++
		mu.Unlock()
		release()
		return nil
	})
	cfg.Handlers = handlers
	c, err := queues.NewClient(r.Client, cfg)
	require.NoError(t, err)
	for range 30 {
		_, err := c.Enqueue(context.Background(), "call", []byte(`{}`), queues.EnqueueOptions{})
		require.NoError(t, err)
	}
	require.NoError(t, c.Start(context.Background()))
	defer func() { require.NoError(t, c.Stop(context.Background())) }()
	testwait.For(t, 30*time.Second, "30 calls done", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return done == 30
	})
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 2, peak, "never more than the capacity of 2 held at once")
}

// TestDependencyBudgetAtReloadFromAdaptive: a reload that makes an
// adaptive pool static is checked with the size it will run at (its
// configured one: the limit's own size is cleared), not with the limit;
// refused, it changes nothing, the dependency's capacity included. A job
// holds its share of two dependencies at once.
func TestDependencyBudgetAtReloadFromAdaptive(t *testing.T) {
	r := testredis.New(t)
	cfg := queues.Config{
		Namespace: r.Namespace(t), Tiers: testPolicy(t), Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: 5 * time.Second,
		Dependencies: []queues.Dependency{{Name: "reports-db", Capacity: 20}, {Name: "mail-api", Capacity: 12}},
		Pools: []queues.PoolConfig{
			{Name: "order", Size: 8, MaxSize: 12, JobTypes: []string{"order:create"}, PollInterval: 10 * time.Millisecond,
				Uses: map[string]int{"reports-db": 1, "mail-api": 1}},
			{Name: "batch", Size: 2, MaxSize: 4, JobTypes: []string{"report:run"}, PollInterval: 10 * time.Millisecond,
				Uses: map[string]int{"reports-db": 2}, Adaptive: &queues.AdaptiveConfig{Min: 1, Window: 100 * time.Millisecond}},
		},
	}
	var mu sync.Mutex
	var capacities []int
	var both []error
	h := queues.NewHandlers()
	h.HandleFunc("order:create", func(ctx context.Context, _ *asynq.Task) error {
		db, err := queues.DependencyOf(ctx, "reports-db")
		if err != nil {
			return err
		}
		mail, err := queues.DependencyOf(ctx, "mail-api")
		if err != nil {
			return err
		}
		r1, err1 := db.Acquire(ctx)
		r2, err2 := mail.Acquire(ctx)
		if err1 == nil {
			defer r1()
		}
		if err2 == nil {
			defer r2()
		}
		mu.Lock()
		capacities = append(capacities, db.Capacity())
		both = append(both, errors.Join(err1, err2))
		mu.Unlock()
		return nil
	})
	h.HandleFunc("report:run", func(ctx context.Context, _ *asynq.Task) error {
		dep, err := queues.DependencyOf(ctx, "reports-db")
		if err != nil {
			return err
		}
		release, err := dep.Acquire(ctx) // the limit follows the jobs that take their share
		if err != nil {
			return err
		}
		release()
		return nil
	})
	cfg.Handlers = h
	c, err := queues.NewClient(r.Client, cfg)
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	defer func() { require.NoError(t, c.Stop(context.Background())) }()
	ctx := context.Background()
	for range 20 {
		_, err := c.Enqueue(ctx, "report:run", []byte(`{}`), queues.EnqueueOptions{})
		require.NoError(t, err)
	}
	testwait.For(t, 20*time.Second, "the adaptive limit's first decision", func() bool {
		st, err := c.Stats(ctx)
		require.NoError(t, err)
		return st.Adaptive["batch"] != nil && st.Adaptive["batch"].Baseline > 0
	})
	require.NoError(t, c.Resize(ctx, "order", 12), "12 + batch 4×2 = 20")

	next := cfg
	next.Dependencies = []queues.Dependency{{Name: "reports-db", Capacity: 19}, {Name: "mail-api", Capacity: 12}}
	next.Pools = []queues.PoolConfig{cfg.Pools[0], cfg.Pools[1]}
	next.Pools[1].Adaptive = nil
	next.Pools[1].Size = 3
	next.Pools[1].Uses = map[string]int{"reports-db": 3}
	require.NoError(t, next.Validate(), "at the configured sizes, 8 + 3×3 fits 19")
	_, err = c.Reconfigure(ctx, next)
	var ce *queues.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, []string{`with the sizes in effect: dependency "reports-db": the pools claim 21 but its capacity is 19: order 12×1 = 12 (size) + batch 3×3 = 9 (size); shrink the pools, lower their uses, raise the capacity, or set allow_overbooking`}, ce.Problems)

	_, err = c.Enqueue(ctx, "order:create", []byte(`{}`), queues.EnqueueOptions{})
	require.NoError(t, err)
	testwait.For(t, 20*time.Second, "the order job", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(capacities) == 1
	})
	mu.Lock()
	require.Equal(t, []int{20}, capacities, "the refused reload left the capacity as it was")
	require.NoError(t, both[0], "one share of each of two dependencies at once")
	mu.Unlock()
}
