// Package priority holds business priority tiers: an ordered list of tiers
// (highest first), a default tier, and an optional assignment of names (a
// report, a customer, any key a job carries) to tiers.
//
// The tiers belong to the business, not to the code: an application loads
// them from a file its business owners edit and hands the Policy to the
// engine (queues.Config.Tiers). A Policy is validated when it is built and
// never changes afterwards; every problem is reported at once.
//
// A name's tier is resolved as: the tier chosen explicitly, else the name's
// assignment, else the default tier.
package priority

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
)

// ErrUnknownTier is matched by errors about a tier name the policy does not
// define.
var ErrUnknownTier = errors.New("priority: unknown tier")

// namePattern is what a tier name may look like. Tier names become part of
// queue names, so they are kept to a small, readable alphabet.
var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// Config describes a policy.
type Config struct {
	// Tiers lists the tier names, highest priority first. Required; each
	// name matches ^[a-z0-9][a-z0-9_-]{0,62}$.
	Tiers []string
	// Default is the tier of a name that has no assignment. Required; must
	// be one of Tiers.
	Default string
	// Assign maps a name to its tier. Optional.
	Assign map[string]string
}

// Policy is a validated set of tiers. It is immutable and safe for
// concurrent use.
type Policy struct {
	tiers  []string
	rank   map[string]int
	def    string
	assign map[string]string
}

// New validates c and returns its Policy, or an error listing every
// problem. c is not retained.
func New(c Config) (*Policy, error) {
	var errs []error
	rank := make(map[string]int, len(c.Tiers))
	if len(c.Tiers) == 0 {
		errs = append(errs, errors.New("tiers: the list must name at least one tier"))
	}
	for i, t := range c.Tiers {
		if !namePattern.MatchString(t) {
			errs = append(errs, fmt.Errorf("tiers: tier %q: a name must match %s", t, namePattern))
		}
		if _, dup := rank[t]; dup {
			errs = append(errs, fmt.Errorf("tiers: tier %q is listed twice", t))
			continue
		}
		rank[t] = i
	}
	switch _, ok := rank[c.Default]; {
	case c.Default == "":
		errs = append(errs, errors.New("default: a default tier is required"))
	case !ok:
		errs = append(errs, fmt.Errorf("default: tier %q is not in tiers %q", c.Default, c.Tiers))
	}
	assign := make(map[string]string, len(c.Assign))
	for _, name := range sortedKeys(c.Assign) {
		tier := c.Assign[name]
		if name == "" {
			errs = append(errs, errors.New("an empty name is assigned a tier"))
		}
		if _, ok := rank[tier]; !ok {
			errs = append(errs, fmt.Errorf("%q: tier %q is not in tiers %q", name, tier, c.Tiers))
		}
		assign[name] = tier
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &Policy{tiers: slices.Clone(c.Tiers), rank: rank, def: c.Default, assign: assign}, nil
}

// Tiers returns the tier names, highest priority first.
func (p *Policy) Tiers() []string { return slices.Clone(p.tiers) }

// Default returns the default tier.
func (p *Policy) Default() string { return p.def }

// Has reports whether tier is defined.
func (p *Policy) Has(tier string) bool {
	_, ok := p.rank[tier]
	return ok
}

// Rank returns tier's position, 0 for the highest tier, or an error matching
// ErrUnknownTier.
func (p *Policy) Rank(tier string) (int, error) {
	r, ok := p.rank[tier]
	if !ok {
		return 0, p.unknown(tier)
	}
	return r, nil
}

// Assigned returns the tier assigned to name, if it has one.
func (p *Policy) Assigned(name string) (string, bool) {
	t, ok := p.assign[name]
	return t, ok
}

// Names returns the names that have an assigned tier, sorted.
func (p *Policy) Names() []string { return sortedKeys(p.assign) }

// Resolve returns name's tier: explicit when it is not empty, else name's
// assignment, else the default tier. An explicit tier the policy does not
// define is an error matching ErrUnknownTier.
func (p *Policy) Resolve(name, explicit string) (string, error) {
	if explicit != "" {
		if !p.Has(explicit) {
			return "", p.unknown(explicit)
		}
		return explicit, nil
	}
	if t, ok := p.assign[name]; ok {
		return t, nil
	}
	return p.def, nil
}

// Order returns tiers sorted in the policy's order, highest first. Tiers
// the policy does not define sort last, in their given order.
func (p *Policy) Order(tiers []string) []string {
	out := slices.Clone(tiers)
	r := func(t string) int {
		if n, ok := p.rank[t]; ok {
			return n
		}
		return len(p.tiers)
	}
	sort.SliceStable(out, func(i, j int) bool { return r(out[i]) < r(out[j]) })
	return out
}

// Inversions counts tier inversions in a start order: each start of a tier
// after a start of a lower tier. With strict tiers and every job enqueued
// before the first start, a correct run has none. Unknown tiers rank last.
func (p *Policy) Inversions(startTiers []string) int {
	n, lowest := 0, -1
	for _, t := range startTiers {
		r, ok := p.rank[t]
		if !ok {
			r = len(p.tiers)
		}
		if r < lowest {
			n++
		}
		lowest = max(lowest, r)
	}
	return n
}

func (p *Policy) unknown(tier string) error {
	return fmt.Errorf("%w %q (tiers, highest first: %q)", ErrUnknownTier, tier, p.tiers)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
