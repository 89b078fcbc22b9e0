// Package priority holds the business's priority tiers: an ordered list of
// tiers (highest first), a default tier, and which tier each report belongs
// to.
//
// The tiers live in a file the business owns (the finance team, say), not in
// code: reordering tiers or moving a report to another tier is a config edit
// and a restart. A Policy is loaded strictly and validated before anything
// uses it; every problem is reported at once.
//
//	# priorities.yaml
//	tiers: [regulatory, close, management, adhoc]   # highest first
//	default: adhoc
//	reports:
//	  vat-return: regulatory
//	  trial-balance: close
//
// A report's tier is resolved as: the tier chosen explicitly at enqueue, else
// the report's entry in the mapping, else the default tier.
package priority

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/lci-labs/compartment/internal/yamlx"
)

// ErrUnknownTier is matched by errors about a tier name the policy does not
// define.
var ErrUnknownTier = errors.New("priority: unknown tier")

// namePattern is what a tier name may look like. Tier names become part of
// queue names, so they are kept to a small, readable alphabet.
var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// File is the on-disk shape of a priorities file.
type File struct {
	// Tiers lists the tier names, highest priority first. Required.
	Tiers []string `yaml:"tiers"`
	// Default is the tier of a report that has no entry in Reports. Required;
	// must be one of Tiers.
	Default string `yaml:"default"`
	// Reports maps a report name to its tier. Optional.
	Reports map[string]string `yaml:"reports"`
}

// Policy is a validated set of tiers. It is immutable and safe for
// concurrent use.
type Policy struct {
	tiers   []string
	rank    map[string]int
	def     string
	reports map[string]string
}

// Load reads and validates the priorities file at path.
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("priorities: %w", err)
	}
	p, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("priorities file %s: %w", path, err)
	}
	return p, nil
}

// Parse decodes a priorities file strictly (unknown keys are errors) and
// validates it.
func Parse(data []byte) (*Policy, error) {
	var f File
	if err := yamlx.DecodeStrict(data, &f); err != nil {
		return nil, err
	}
	return New(f)
}

// New validates f and returns its Policy, or an error listing every problem.
func New(f File) (*Policy, error) {
	var errs []error
	rank := make(map[string]int, len(f.Tiers))
	if len(f.Tiers) == 0 {
		errs = append(errs, errors.New("tiers: the list must name at least one tier"))
	}
	for i, t := range f.Tiers {
		if !namePattern.MatchString(t) {
			errs = append(errs, fmt.Errorf("tiers: tier %q: a name must match %s", t, namePattern))
		}
		if _, dup := rank[t]; dup {
			errs = append(errs, fmt.Errorf("tiers: tier %q is listed twice", t))
			continue
		}
		rank[t] = i
	}
	switch _, ok := rank[f.Default]; {
	case f.Default == "":
		errs = append(errs, errors.New("default: a default tier is required"))
	case !ok:
		errs = append(errs, fmt.Errorf("default: tier %q is not in tiers %q", f.Default, f.Tiers))
	}
	reports := make(map[string]string, len(f.Reports))
	for _, name := range sortedKeys(f.Reports) {
		tier := f.Reports[name]
		if err := ValidateReportName(name); err != nil {
			errs = append(errs, fmt.Errorf("reports: %w", err))
		}
		if _, ok := rank[tier]; !ok {
			errs = append(errs, fmt.Errorf("reports: report %q: tier %q is not in tiers %q", name, tier, f.Tiers))
		}
		reports[name] = tier
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &Policy{tiers: slices.Clone(f.Tiers), rank: rank, def: f.Default, reports: reports}, nil
}

var reportPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidateReportName reports whether name is usable as a report name: it
// becomes part of file names and task IDs, so path separators, "..", spaces
// and other punctuation are rejected.
func ValidateReportName(name string) error {
	if !reportPattern.MatchString(name) || strings.Contains(name, "..") {
		return fmt.Errorf("report name %q is invalid: use letters, digits, '.', '_' and '-' (no path separators, no \"..\"), starting with a letter or digit, at most 128 characters", name)
	}
	return nil
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

// Mapped returns the tier the mapping gives report, if it has an entry.
func (p *Policy) Mapped(report string) (string, bool) {
	t, ok := p.reports[report]
	return t, ok
}

// Reports returns the mapped report names, sorted.
func (p *Policy) Reports() []string { return sortedKeys(p.reports) }

// Resolve returns report's tier: explicit when it is not empty, else the
// mapping's entry for report, else the default tier. An explicit tier the
// policy does not define is an error matching ErrUnknownTier.
func (p *Policy) Resolve(report, explicit string) (string, error) {
	if explicit != "" {
		if !p.Has(explicit) {
			return "", p.unknown(explicit)
		}
		return explicit, nil
	}
	if t, ok := p.reports[report]; ok {
		return t, nil
	}
	return p.def, nil
}

// Order sorts tiers (a subset of the policy's, known to be valid) in the
// policy's order, highest first.
func (p *Policy) Order(tiers []string) []string {
	out := slices.Clone(tiers)
	sort.SliceStable(out, func(i, j int) bool { return p.rank[out[i]] < p.rank[out[j]] })
	return out
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
