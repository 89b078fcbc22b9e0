// Package queues runs worker pools on asynq: each pool is a bulkhead with its
// own asynq.Server, its own queues and its own concurrency, so a flood of one
// kind of job cannot take worker slots from another.
//
// # Queue naming
//
// Every pool owns one asynq queue per priority tier, named
//
//	<namespace>:<pool>:<tier>     for example  compartment:batch:regulatory
//
// and a pool without tiers owns the single queue <namespace>:<pool> (for
// example compartment:order). The namespace (default "compartment") lets
// several deployments share one Redis. Because these are ordinary asynq
// queues, asynq's own tools (the asynq CLI, asynqmon) list and inspect them.
//
// # Order inside a pool
//
// With queue_order strict (the default) the pool's server always tries its
// tiers highest first: a job of a lower tier starts only when every higher
// tier's queue is empty. Within a tier, jobs start first in, first out
// (asynq's pending lists are FIFO; a retried job goes to the back).
package queues

import (
	"fmt"
	"slices"
	"sync"

	"github.com/lci-labs/compartment/bulkhead"
	"github.com/lci-labs/compartment/priority"
)

// QueueName returns the asynq queue of a pool's tier; tier "" names the
// queue of a pool without tiers.
func QueueName(namespace, pool, tier string) string {
	if tier == "" {
		return namespace + ":" + pool
	}
	return namespace + ":" + pool + ":" + tier
}

// Pool is a validated pool: a name, a bulkhead and the queues it serves.
type Pool struct {
	cfg      PoolConfig
	tiers    []string // priority order, highest first; nil without tiers
	queues   []string // parallel to tiers; one queue without tiers
	bulkhead *bulkhead.Bulkhead
}

// Name returns the pool's name.
func (p *Pool) Name() string { return p.cfg.Name }

// Size returns the pool's size: its bulkhead size and asynq concurrency.
func (p *Pool) Size() int { return p.cfg.Size }

// Config returns the pool's configuration, defaults filled.
func (p *Pool) Config() PoolConfig { return p.cfg }

// JobTypes returns the job types routed to the pool.
func (p *Pool) JobTypes() []string { return slices.Clone(p.cfg.JobTypes) }

// Tiers returns the pool's tiers, highest first, or nil for a pool without
// tiers.
func (p *Pool) Tiers() []string { return slices.Clone(p.tiers) }

// Queues returns the pool's asynq queues in the order its server tries them
// under strict ordering (highest tier first).
func (p *Pool) Queues() []string { return slices.Clone(p.queues) }

// Bulkhead returns the bulkhead every job of the pool runs in.
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
	for i, t := range p.tiers {
		if t == tier {
			return p.queues[i], nil
		}
	}
	return "", fmt.Errorf("pool %q does not serve tier %q (its tiers: %q)", p.cfg.Name, tier, p.tiers)
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

// Registry holds the pools of one worker: it gets a pool by name and routes a
// job type to its pool. It is safe for concurrent use.
type Registry struct {
	namespace string
	policy    *priority.Policy
	bulkheads *bulkhead.Registry

	mu        sync.RWMutex
	pools     []*Pool
	byName    map[string]*Pool
	byJobType map[string]*Pool
}

// NewRegistry returns an empty registry for pools in namespace, with tiers
// from policy (nil when no pool has tiers).
func NewRegistry(namespace string, policy *priority.Policy) *Registry {
	return &Registry{
		namespace: namespace,
		policy:    policy,
		bulkheads: bulkhead.NewRegistry(),
		byName:    map[string]*Pool{},
		byJobType: map[string]*Pool{},
	}
}

// NewRegistryFromConfig registers every pool of a validated config.
func NewRegistryFromConfig(cfg *Config) (*Registry, error) {
	r := NewRegistry(cfg.Namespace, cfg.Policy)
	for _, pc := range cfg.Pools {
		if _, err := r.Register(pc); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Namespace returns the queue namespace.
func (r *Registry) Namespace() string { return r.namespace }

// Policy returns the priority policy, or nil.
func (r *Registry) Policy() *priority.Policy { return r.policy }

// Bulkheads returns the registry of the pools' bulkheads.
func (r *Registry) Bulkheads() *bulkhead.Registry { return r.bulkheads }

// Register adds a pool, filling its defaults. An invalid pool, a duplicate
// name, or a job type already routed is an error and changes nothing.
func (r *Registry) Register(pc PoolConfig) (*Pool, error) {
	pc.SetDefaults()
	if problems := poolProblems(len(r.pools), pc, r.policy != nil, r.policy); len(problems) > 0 {
		return nil, &ConfigError{File: "(pool registry)", Problems: problems}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.byName[pc.Name]; ok {
		return nil, fmt.Errorf("pool %q: duplicate pool name", pc.Name)
	}
	for _, jt := range pc.JobTypes {
		if other, ok := r.byJobType[jt]; ok {
			return nil, fmt.Errorf("job type %q is routed to two pools: %q and %q", jt, other.Name(), pc.Name)
		}
	}
	bh, err := r.bulkheads.Register(bulkhead.Config{Name: pc.Name, MaxConcurrent: pc.Size})
	if err != nil {
		return nil, err
	}
	p := &Pool{cfg: pc, bulkhead: bh}
	if pc.Tiers == nil {
		p.queues = []string{QueueName(r.namespace, pc.Name, "")}
	} else {
		p.tiers = r.policy.Order(pc.Tiers)
		for _, t := range p.tiers {
			p.queues = append(p.queues, QueueName(r.namespace, pc.Name, t))
		}
	}
	r.pools = append(r.pools, p)
	r.byName[pc.Name] = p
	for _, jt := range pc.JobTypes {
		r.byJobType[jt] = p
	}
	return p, nil
}

// Get returns the pool called name.
func (r *Registry) Get(name string) (*Pool, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if p, ok := r.byName[name]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("unknown pool %q (pools: %q)", name, r.names())
}

// Route returns the pool a job type is routed to.
func (r *Registry) Route(jobType string) (*Pool, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if p, ok := r.byJobType[jobType]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("job type %q is routed to no pool (pools: %q)", jobType, r.names())
}

// Pools returns the pools in registration order.
func (r *Registry) Pools() []*Pool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Clone(r.pools)
}

func (r *Registry) names() []string {
	out := make([]string, len(r.pools))
	for i, p := range r.pools {
		out[i] = p.Name()
	}
	return out
}
