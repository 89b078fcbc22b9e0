package queues

import (
	"errors"
	"fmt"
	"slices"

	"github.com/lci-labs/compartment/bulkhead"
	"github.com/lci-labs/compartment/priority"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// Pool is a running configuration of one pool: a name, a bulkhead and the
// queues it serves. It is immutable and safe for concurrent use.
type Pool struct {
	cfg      PoolConfig
	tiers    []string // priority order, highest first; nil without tiers
	queues   []string // parallel to tiers; one queue without tiers
	bulkhead *bulkhead.Bulkhead
	door     *poolDoor // nil without a door
}

// Name returns the pool's name.

// ErrUnknownPool is matched by the error of any method given a pool name
// the client's config does not have; nothing was done.
var ErrUnknownPool = errors.New("unknown pool")

func (p *Pool) Name() string { return p.cfg.Name }

// Size returns the pool's configured size. A cluster-scoped pool's size in
// effect may differ while an operator's resize holds (Client.PoolSize).
func (p *Pool) Size() int { return p.cfg.Size }

// MaxSize returns the most a cluster-scoped pool may be resized to (its
// size for a process-scoped pool).
func (p *Pool) MaxSize() int { return p.cfg.concurrency() }

// Scope returns where the pool's size holds.
func (p *Pool) Scope() Scope { return p.cfg.Scope }

// Config returns the pool's configuration, defaults filled.
func (p *Pool) Config() PoolConfig { return p.cfg.WithDefaults() }

// JobTypes returns the job types routed to the pool.
func (p *Pool) JobTypes() []string { return slices.Clone(p.cfg.JobTypes) }

// Tiers returns the pool's tiers, highest first, or nil for a pool without
// tiers.
func (p *Pool) Tiers() []string { return slices.Clone(p.tiers) }

// Queues returns the pool's asynq queues, highest tier first.
func (p *Pool) Queues() []string { return slices.Clone(p.queues) }

// Bulkhead returns the bulkhead every job of the pool runs in, in this
// process: of MaxSize slots (the gate holds a cluster-scoped pool to its
// size in effect across processes).
func (p *Pool) Bulkhead() *bulkhead.Bulkhead { return p.bulkhead }

// QueueFor returns the queue for a job of the given tier. A pool without
// tiers takes tier ""; a pool with tiers needs one of its own tiers.
func (p *Pool) QueueFor(tier string) (string, error) {
	if p.tiers == nil {
		if tier != "" {
			return "", fmt.Errorf("pool %q has no tiers; got tier %q", p.cfg.Name, tier)
		}
		return p.queues[0], nil
	}
	if i := slices.Index(p.tiers, tier); i >= 0 {
		return p.queues[i], nil
	}
	return "", fmt.Errorf("pool %q does not serve tier %q (its tiers: %q)", p.cfg.Name, tier, p.tiers)
}

// TierOf returns the tier of one of the pool's queues ("" for a pool
// without tiers).
func (p *Pool) TierOf(queue string) string {
	if i := slices.Index(p.queues, queue); i >= 0 && p.tiers != nil {
		return p.tiers[i]
	}
	return ""
}

// rank returns the 1-based position of queue in the pool's priority order.
func (p *Pool) rank(queue string) int {
	if i := slices.Index(p.queues, queue); i >= 0 {
		return i + 1
	}
	return 1
}

// asynqQueues returns the asynq Config.Queues map: under strict order the
// values only rank the queues (highest tier gets the highest number); under
// weighted order they are the configured weights.
func (p *Pool) asynqQueues() map[string]int {
	m := make(map[string]int, len(p.queues))
	for i, q := range p.queues {
		switch {
		case p.tiers == nil:
			m[q] = 1
		case p.cfg.QueueOrder == QueueOrderWeighted:
			m[q] = p.cfg.Weights[p.tiers[i]]
		default:
			m[q] = len(p.queues) - i
		}
	}
	return m
}

// registry holds the pools of a validated config: it gets a pool by name and
// routes a job type to its pool. It never changes after newRegistry; a
// reconfiguration builds a new one (Client.Reconfigure).
type registry struct {
	tiers     *priority.Policy
	pools     []*Pool
	byName    map[string]*Pool
	byJobType map[string]*Pool
	// deps are the dependencies and the pools' use of them in this
	// process; budget is the config the budgets are checked with (its
	// Dependencies, AllowOverbooking and Pools).
	deps   *dependencies
	budget Config
}

// newRegistry builds the pools of cfg, which has passed Validate. A pool
// whose bulkhead size is the same in prev (nil: none) keeps prev's
// bulkhead, so that the jobs running in it still count. ks names the
// queues for the Redis topology.
func newRegistry(cfg Config, ks rdb.Keyspace, prev *registry) (*registry, error) {
	r := &registry{tiers: cfg.Tiers, byName: map[string]*Pool{}, byJobType: map[string]*Pool{},
		budget: Config{Dependencies: cfg.Dependencies, AllowOverbooking: cfg.AllowOverbooking, Pools: cfg.Pools}}
	var prevDeps *dependencies
	if prev != nil {
		prevDeps = prev.deps
	}
	r.deps = newDependencies(cfg, prevDeps)
	for _, pc := range cfg.Pools {
		var bh *bulkhead.Bulkhead
		if prev != nil {
			if old, ok := prev.byName[pc.Name]; ok && old.bulkhead.MaxConcurrent() == pc.concurrency() {
				bh = old.bulkhead
			}
		}
		if bh == nil {
			var err error
			if bh, err = bulkhead.New(bulkhead.Config{Name: pc.Name, MaxConcurrent: pc.concurrency()}); err != nil {
				return nil, err
			}
		}
		p := &Pool{cfg: pc, bulkhead: bh}
		if pc.Tiers == nil {
			p.queues = []string{ks.Queue(pc.Name, "")}
		} else {
			p.tiers = cfg.Tiers.Order(pc.Tiers)
			for _, t := range p.tiers {
				p.queues = append(p.queues, ks.Queue(pc.Name, t))
			}
		}
		if pc.HasDoor() {
			p.door = newPoolDoor(ks, p)
		}
		r.pools = append(r.pools, p)
		r.byName[pc.Name] = p
		for _, jt := range pc.JobTypes {
			r.byJobType[jt] = p
		}
	}
	return r, nil
}

// pool returns the pool called name, nil when there is none (or r is nil).
func (r *registry) pool(name string) *Pool {
	if r == nil {
		return nil
	}
	return r.byName[name]
}

func (r *registry) get(name string) (*Pool, error) {
	if p, ok := r.byName[name]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("%w %q (pools: %q)", ErrUnknownPool, name, r.names())
}

func (r *registry) route(jobType string) (*Pool, error) {
	if p, ok := r.byJobType[jobType]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("job type %q is routed to no pool (pools: %q)", jobType, r.names())
}

func (r *registry) names() []string {
	out := make([]string, len(r.pools))
	for i, p := range r.pools {
		out[i] = p.Name()
	}
	return out
}
