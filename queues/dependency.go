package queues

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// Dependency is something the pools' jobs draw on beside their slots: a
// database's connections, an external API's tokens. Capacity is how much
// of it the worker processes may hold at once, all of them together: a
// cluster-scoped pool runs at most its size in effect of jobs across every
// process, each holding what PoolConfig.Uses says, so the pools' claims
// (size × use) are what the dependency sees at most. See
// docs/DEPENDENCIES.md.
type Dependency struct {
	// Name identifies the dependency in the pools' Uses, in errors, status
	// and metrics. Required; matches ^[a-z0-9][a-z0-9_-]{0,62}$.
	Name string `json:"name"`
	// Capacity is how much of the dependency the workers may hold at once.
	// Required; at least 1.
	Capacity int `json:"capacity"`
}

// claimSize is the size a pool's claim on its dependencies counts (defaults
// filled), given its size in effect: an adaptive pool may grow to MaxSize
// on its own at any moment, so it claims that; any other pool claims the
// size in effect, which only an operator changes (and Resize checks).
func (p PoolConfig) claimSize(effective int) int {
	if p.Adaptive != nil {
		return p.MaxSize
	}
	return effective
}

// budgetProblems checks the pools' claims on each dependency against its
// capacity, each pool's size in effect given by size (by name). It names
// every dependency over budget with each pool's share; none when
// AllowOverbooking is set.
func (c Config) budgetProblems(size func(p PoolConfig) int) []string {
	if c.AllowOverbooking {
		return nil
	}
	var out []string
	for _, d := range c.Dependencies {
		if d.Capacity < 1 {
			continue // said by dependencyProblems
		}
		total := 0
		var parts []string
		for _, p := range c.Pools {
			use := p.Uses[d.Name]
			if use < 1 || p.Scope != ScopeCluster {
				continue
			}
			n := p.claimSize(size(p))
			total += n * use
			what := "size"
			if p.Adaptive != nil {
				what = "adaptive up to max_size"
			}
			parts = append(parts, fmt.Sprintf("%s %d×%d = %d (%s)", p.Name, n, use, n*use, what))
		}
		if total > d.Capacity {
			out = append(out, fmt.Sprintf("dependency %q: the pools claim %d but its capacity is %d: %s; shrink the pools, lower their uses, raise the capacity, or set allow_overbooking",
				d.Name, total, d.Capacity, strings.Join(parts, " + ")))
		}
	}
	return out
}

// dependencyProblems checks the dependencies, the pools' uses of them
// (defaults filled) and, at their configured sizes, the budgets.
func (c Config) dependencyProblems() []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	known := map[string]bool{}
	for i, d := range c.Dependencies {
		label := fmt.Sprintf("dependency %q", d.Name)
		if d.Name == "" {
			label = fmt.Sprintf("dependencies[%d]", i)
			add("%s: name is required", label)
		} else if !namePattern.MatchString(d.Name) {
			add("%s: name must match %s", label, namePattern)
		}
		if d.Name != "" && known[d.Name] {
			add("%s: listed twice", label)
		}
		known[d.Name] = true
		if d.Capacity < 1 {
			add("%s: capacity must be >= 1, got %d", label, d.Capacity)
		}
	}
	names := make([]string, 0, len(c.Dependencies))
	for _, d := range c.Dependencies {
		names = append(names, d.Name)
	}
	for _, p := range c.Pools {
		label := fmt.Sprintf("pool %q", p.Name)
		for _, dep := range slices.Sorted(maps.Keys(p.Uses)) {
			switch use := p.Uses[dep]; {
			case !known[dep]:
				add("%s: uses: unknown dependency %q (dependencies: %q)", label, dep, names)
			case use < 1:
				add("%s: uses: %q must be >= 1, got %d", label, dep, use)
			}
		}
		if len(p.Uses) > 0 && p.Scope != ScopeCluster {
			add("%s: uses needs scope: cluster (a per-process pool runs its size in every worker process, so its claim on a dependency grows with the number of workers)", label)
		}
	}
	return append(out, c.budgetProblems(func(p PoolConfig) int { return p.Size })...)
}

// ErrNoDependency is matched by DependencyOf when the job's pool does not
// use the dependency named (PoolConfig.Uses), or ctx is not a job's.
var ErrNoDependency = errors.New("no such dependency for this pool")

// ErrOverBudget is matched by a resize refused because the pools would
// claim more of a dependency than its capacity. Nothing was changed.
var ErrOverBudget = errors.New("over a dependency's budget")

// DependencyHandle is a running job's share of one dependency: how much
// of it the job may hold (Units), and Acquire to hold it. Take it from the
// job's context with DependencyOf.
type DependencyHandle struct {
	dep     *dependencyState
	pool    *poolDependency
	job     *jobDependencies
	units   int
	holding atomic.Bool
}

// Name is the dependency's name.
func (h *DependencyHandle) Name() string { return h.dep.name }

// Units is how much of the dependency one job of the pool holds
// (PoolConfig.Uses): the connections it may open, the tokens it may spend.
func (h *DependencyHandle) Units() int { return h.units }

// Capacity is the dependency's capacity (Dependency.Capacity).
func (h *DependencyHandle) Capacity() int {
	h.dep.mu.Lock()
	defer h.dep.mu.Unlock()
	return h.dep.capacity
}

// Acquire holds the job's units of the dependency until release is
// called (release is idempotent and must be called). In this process no
// more than the dependency's capacity is held at once by all pools
// together: when that is reached (the pools are overbooked,
// AllowOverbooking), Acquire waits for units to be released, or until ctx
// ends. The time it waits counts as the job waiting for its dependency,
// which an adaptive pool's limit follows (docs/DEPENDENCIES.md). A job
// holds its units of each dependency at most once at a time: a second
// Acquire of the same handle before release is an error, so a handler
// that would take two connections is caught. The capacity holds per
// process: with AllowOverbooking, N workers may hold up to N times it.
func (h *DependencyHandle) Acquire(ctx context.Context) (release func(), err error) {
	if !h.holding.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("dependency %q: this job already holds its %d (release them first)", h.dep.name, h.units)
	}
	asked := time.Now()
	err = h.dep.acquire(ctx, h.units)
	h.job.waited.Add(int64(time.Since(asked))) // a wait that ended in an error counts too
	if err != nil {
		h.holding.Store(false)
		return nil, fmt.Errorf("dependency %q: %w", h.dep.name, err)
	}
	h.pool.held.Add(int64(h.units))
	h.job.acquired.Store(true)
	var once sync.Once
	return func() {
		once.Do(func() {
			h.pool.held.Add(-int64(h.units))
			h.dep.release(h.units)
			h.holding.Store(false)
		})
	}, nil
}

// DependencyOf returns the running job's handle on the dependency called
// name: ctx is the job's (a handler's context). It fails with an error
// matching ErrNoDependency when the job's pool does not use it.
func DependencyOf(ctx context.Context, name string) (*DependencyHandle, error) {
	jd, _ := ctx.Value(jobDependenciesKey{}).(*jobDependencies)
	if jd == nil {
		return nil, fmt.Errorf("%w: %q (not a job's context)", ErrNoDependency, name)
	}
	h, ok := jd.handles[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q: pool %q uses %q", ErrNoDependency, name, jd.pool, slices.Sorted(maps.Keys(jd.handles)))
	}
	return h, nil
}

type jobDependenciesKey struct{}

// jobDependencies is one job's handles and what it waited for them.
type jobDependencies struct {
	pool     string
	handles  map[string]*DependencyHandle
	waited   atomic.Int64 // ns, over all its handles
	acquired atomic.Bool  // it took a share of a dependency
}

// sampled says whether the job's time may feed its pool's adaptive limit:
// in a pool that declares dependencies, only a job that took its share
// (another job type of the pool, a bundle that touches no database, would
// drag the baseline away from the dependency's time); in any other pool,
// every job.
func (jd *jobDependencies) sampled() bool { return jd == nil || jd.acquired.Load() }

// dependencyState is one dependency in this process: its capacity as a
// counting semaphore shared by every pool.
type dependencyState struct {
	name     string
	capacity int

	mu    sync.Mutex
	held  int
	freed chan struct{} // closed and replaced at each release
}

func newDependencyState(d Dependency) *dependencyState {
	return &dependencyState{name: d.Name, capacity: d.Capacity, freed: make(chan struct{})}
}

func (d *dependencyState) acquire(ctx context.Context, n int) error {
	for {
		d.mu.Lock()
		if d.held+n <= d.capacity || d.held == 0 {
			d.held += n
			d.mu.Unlock()
			return nil
		}
		freed := d.freed
		d.mu.Unlock()
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d of its capacity %d: %w", n, d.capacity, context.Cause(ctx))
		case <-freed:
		}
	}
}

func (d *dependencyState) setCapacity(n int) {
	d.mu.Lock()
	d.capacity = n
	close(d.freed) // a larger capacity may let waiters in
	d.freed = make(chan struct{})
	d.mu.Unlock()
}

func (d *dependencyState) release(n int) {
	d.mu.Lock()
	d.held -= n
	close(d.freed)
	d.freed = make(chan struct{})
	d.mu.Unlock()
}

// poolDependency is one pool's use of one dependency in this process.
type poolDependency struct {
	held atomic.Int64 // units held now by the pool's jobs in this process
}

// dependencies is a client's dependencies in this process, and each
// pool's use of them.
type dependencies struct {
	byName map[string]*dependencyState
	// uses: pool -> dependency -> its use in this process.
	uses map[string]map[string]*poolDependency
	// capacity is each dependency's capacity in this config, set on the
	// shared states by commit once the config is in effect.
	capacity map[string]int
}

// commit gives the dependencies kept from an earlier config their new
// capacity: called once a Reconfigure has passed every check.
func (d *dependencies) commit() {
	for name, n := range d.capacity {
		d.byName[name].setCapacity(n)
	}
}

// newDependencies returns cfg's dependencies. Those in prev (nil: none)
// are kept, so that what running jobs hold still counts after a
// Reconfigure; they take cfg's capacity at commit.
func newDependencies(cfg Config, prev *dependencies) *dependencies {
	d := &dependencies{byName: map[string]*dependencyState{}, uses: map[string]map[string]*poolDependency{}}
	for _, dep := range cfg.Dependencies {
		if old := prev.state(dep.Name); old != nil {
			d.byName[dep.Name] = old // its capacity changes at commit
			continue
		}
		d.byName[dep.Name] = newDependencyState(dep)
	}
	d.capacity = map[string]int{}
	for _, dep := range cfg.Dependencies {
		d.capacity[dep.Name] = dep.Capacity
	}
	for _, p := range cfg.Pools {
		for name := range p.Uses {
			if d.uses[p.Name] == nil {
				d.uses[p.Name] = map[string]*poolDependency{}
			}
			pd := &poolDependency{}
			if prev != nil && prev.uses[p.Name][name] != nil {
				pd = prev.uses[p.Name][name]
			}
			d.uses[p.Name][name] = pd
		}
	}
	return d
}

func (d *dependencies) state(name string) *dependencyState {
	if d == nil {
		return nil
	}
	return d.byName[name]
}

// held returns the units of dependency name pool's jobs hold in this
// process now.
func (d *dependencies) held(pool, name string) int64 {
	if pd := d.uses[pool][name]; pd != nil {
		return pd.held.Load()
	}
	return 0
}

// forJob returns the context of a job of pool p with its handles, and
// the job's record of what it waited; ctx as it is when the pool uses no
// dependency.
func (d *dependencies) forJob(ctx context.Context, p PoolConfig) (context.Context, *jobDependencies) {
	uses := d.uses[p.Name]
	if len(uses) == 0 {
		return ctx, nil
	}
	jd := &jobDependencies{pool: p.Name, handles: make(map[string]*DependencyHandle, len(uses))}
	for name, pd := range uses {
		dep := d.byName[name]
		if dep == nil {
			continue
		}
		jd.handles[name] = &DependencyHandle{dep: dep, pool: pd, job: jd, units: cmp.Or(p.Uses[name], 1)}
	}
	return context.WithValue(ctx, jobDependenciesKey{}, jd), jd
}

// checkBudget checks the pools' claims on their dependencies with the
// sizes in effect in Redis (an operator's, or the configured one; for a
// shrunk pool, the slots its running jobs still hold if more), the pool
// named resized taken at size. It returns an error matching
// ErrOverBudget that names every dependency over budget with each pool's
// share, or nil. reg gives the pools and the budgets.
func (c *Client) checkBudget(ctx context.Context, reg *registry, resized string, size int) error {
	return c.checkBudgetFrom(ctx, nil, reg, resized, size)
}

// checkBudgetFrom is checkBudget for a reload from old (nil: none): a pool
// adaptive in old and not in reg will run at its configured size unless an
// operator's size is in effect (the limit's own is cleared), so that is
// what it claims.
func (c *Client) checkBudgetFrom(ctx context.Context, old, reg *registry, resized string, size int) error {
	cfg := reg.budget
	if cfg.AllowOverbooking || len(cfg.Dependencies) == 0 {
		return nil
	}
	batch := rdb.NewPools(c.rdb, c.ks).Batch()
	reads := map[string]*rdb.PoolStatsRead{}
	wasAdaptive := map[string]*rdb.AdaptiveRead{}
	for _, p := range cfg.Pools {
		if len(p.Uses) > 0 && p.Scope == ScopeCluster && p.Adaptive == nil && p.Name != resized {
			reads[p.Name] = batch.PoolStats(rdb.PoolStatsArgs{Pool: p.Name, Cluster: true})
			if o := old.pool(p.Name); o != nil && o.cfg.Adaptive != nil {
				wasAdaptive[p.Name] = batch.Adaptive(p.Name, 0)
			}
		}
	}
	if len(reads) > 0 {
		if err := batch.Exec(ctx); err != nil {
			return fmt.Errorf("read the pools' sizes for the dependency budgets: %w", err)
		}
	}
	sizes := map[string]int{}
	for name, read := range reads {
		st, err := read.Result()
		if err != nil {
			return fmt.Errorf("read pool %q's size for the dependency budgets: %w", name, err)
		}
		n := reg.byName[name].Size()
		operator := true
		if read := wasAdaptive[name]; read != nil {
			a, err := read.Result()
			if err != nil {
				return fmt.Errorf("read pool %q's adaptive limit for the dependency budgets: %w", name, err)
			}
			operator = a.Operator
		}
		if st.Slots.OperatorSize >= 1 && operator {
			n = int(st.Slots.OperatorSize)
		}
		sizes[name] = max(n, int(st.Slots.InUse))
	}
	problems := cfg.budgetProblems(func(p PoolConfig) int {
		if p.Name == resized {
			return size
		}
		if n, ok := sizes[p.Name]; ok {
			return n
		}
		return p.Size
	})
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrOverBudget, strings.Join(problems, "; "))
	}
	return nil
}
