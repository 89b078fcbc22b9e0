package queues

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/lci-labs/compartment/priority"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// Steering: reserved slots per tier and the starvation guard (a tier's
// maximum wait). Both are enforced by the cluster-wide gate (gate.go,
// rdb's lua/gate_lib.lua: needs, agedTier, settle) and explained in
// docs/STEERING.md.

// MinMaxWait is the smallest PoolConfig.MaxWait: the gate sees a wait at
// each call it gets (a job taken or freed, the keeper every 2 s), so a
// shorter limit could not be kept anyway.
const MinMaxWait = time.Second

// steeringProblems checks Reserved and MaxWait (defaults filled).
func (p PoolConfig) steeringProblems(label string, policy *priority.Policy) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if len(p.Reserved) == 0 && len(p.MaxWait) == 0 {
		return nil
	}
	var order []string // the pool's tiers, highest first, when known
	if p.Tiers != nil && policy != nil {
		for _, t := range p.Tiers {
			if !policy.Has(t) {
				order = nil // reported with the tiers
				break
			}
			order = append(order, t)
		}
		if order != nil {
			order = policy.Order(order)
		}
	}
	check := func(key string, tiers []string) {
		if p.Tiers == nil {
			add("%s: %s needs tiers", label, key)
		}
		if p.Scope != ScopeCluster {
			add("%s: %s needs scope: %s (the cluster-wide gate shares the slots among the tiers)", label, key, ScopeCluster)
		}
		for _, t := range tiers {
			if p.Tiers != nil && !slices.Contains(p.Tiers, t) {
				add("%s: %s: tier %q is not one of the pool's tiers (%q)", label, key, t, p.Tiers)
			}
		}
	}
	if len(p.Reserved) > 0 {
		tiers := slices.Sorted(maps.Keys(p.Reserved))
		check("reserved", tiers)
		sum := 0
		for _, t := range tiers {
			n := p.Reserved[t]
			if n < 1 {
				add("%s: reserved: tier %q must be >= 1, got %d", label, t, n)
			}
			sum += max(n, 0)
			if len(order) > 1 && t == order[len(order)-1] {
				add("%s: reserved: tier %q is the pool's lowest tier: a slot reserved for it and the tiers above it is open to every job, so it reserves nothing", label, t)
			}
		}
		if p.Size >= 1 && sum >= p.Size {
			add("%s: reserved: %d slots reserved in all, but the pool's size is %d: at least one slot must stay open to every tier", label, sum, p.Size)
		}
	}
	if len(p.MaxWait) > 0 {
		tiers := slices.Sorted(maps.Keys(p.MaxWait))
		check("max_wait", tiers)
		if p.QueueOrder != QueueOrderStrict {
			add("%s: max_wait needs queue_order: %s (weighted order already serves every tier)", label, QueueOrderStrict)
		}
		for _, t := range tiers {
			if w := p.MaxWait[t]; w < MinMaxWait {
				add("%s: max_wait: tier %q must be at least %s, got %s", label, t, MinMaxWait, w)
			}
			if len(order) > 0 && t == order[0] {
				add("%s: max_wait: tier %q is the pool's highest tier: nothing is served before it anyway", label, t)
			}
		}
	}
	return out
}

// steering returns a pool's reservations and maximum waits for the gate's
// scripts, per tier, highest first, or nil when the pool has neither (the
// scripts then skip the steering).
func (p *Pool) steering() []rdb.TierSteering {
	if len(p.cfg.Reserved) == 0 && len(p.cfg.MaxWait) == 0 {
		return nil
	}
	out := make([]rdb.TierSteering, len(p.tiers))
	for i, t := range p.tiers {
		out[i] = rdb.TierSteering{Reserved: p.cfg.Reserved[t], MaxWait: p.cfg.MaxWait[t]}
	}
	return out
}
