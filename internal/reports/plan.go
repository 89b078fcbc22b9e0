package reports

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/lci-labs/compartment/internal/quote"
	"github.com/lci-labs/compartment/internal/yamlx"
	"github.com/lci-labs/compartment/priority"
)

// PlanEntry is one report of a month-end plan.
type PlanEntry struct {
	// Name is the report's name in the catalog.
	Name string `yaml:"name"`
	// Tier overrides the priorities file's tier for this run. Optional.
	Tier string `yaml:"tier,omitempty"`
}

// Plan is a validated month-end plan: each report with its resolved tier,
// and the jobs its run enqueues when it ends.
type Plan struct {
	Period  Period
	Entries []PlannedReport
	// Path is the file the plan was read from ("" when parsed from bytes).
	Path string
	// OnComplete is enqueued once every report of the run has succeeded or
	// failed for good; OnFailure too when one failed for good. Optional.
	OnComplete, OnFailure *Step
}

// Step is a job a month-end's run enqueues when it ends: its job type,
// its payload (a mapping; the run's summary is added to it as "run") and,
// for a pool with tiers, its tier. Whether a pool serves the job type is
// the config's to check (the plan does not know the pools).
type Step struct {
	JobType string         `yaml:"job_type" json:"job_type"`
	Payload map[string]any `yaml:"payload,omitempty" json:"payload,omitempty"`
	Tier    string         `yaml:"tier,omitempty" json:"tier,omitempty"`
}

// PayloadJSON returns the step's payload as a JSON object (nil for none).
func (s *Step) PayloadJSON() ([]byte, error) {
	if len(s.Payload) == 0 {
		return nil, nil
	}
	return json.Marshal(s.Payload)
}

// Problems names what is wrong with the step on its own, each prefixed
// with label: a missing job type, a payload that is not JSON, the
// reserved field "run".
func (s *Step) Problems(label string) []string {
	var out []string
	if strings.TrimSpace(s.JobType) == "" {
		out = append(out, label+": job_type is required")
	}
	if _, err := s.PayloadJSON(); err != nil {
		out = append(out, fmt.Sprintf("%s: payload: %v", label, err))
	}
	if _, ok := s.Payload["run"]; ok {
		out = append(out, label+`: payload: the field "run" is the run's summary; choose another name`)
	}
	return out
}

// PlannedReport is a plan entry with its tier resolved.
type PlannedReport struct {
	Name string
	Tier string
}

type planFile struct {
	Reports    []PlanEntry `yaml:"reports"`
	OnComplete *Step       `yaml:"on_complete,omitempty"`
	OnFailure  *Step       `yaml:"on_failure,omitempty"`
}

// LoadPlan reads a plan file and validates it against the catalog, the
// priorities and the period; see ParsePlan. A file larger than
// yamlx.MaxFileSize is refused unread.
func LoadPlan(path, period string, cat *Catalog, pol *priority.Policy) (*Plan, error) {
	data, err := yamlx.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	p, err := ParsePlan(data, period, cat, pol)
	if err != nil {
		return nil, fmt.Errorf("plan %s: %w", path, err)
	}
	p.Path = path
	return p, nil
}

// ParsePlan decodes a plan strictly and checks all of it before anything is
// enqueued: every report must be in the catalog, every tier known, no report
// listed twice, and the period well formed. The error lists every problem,
// quoting the plan's values cut to quote.Max bytes.
func ParsePlan(data []byte, period string, cat *Catalog, pol *priority.Policy) (*Plan, error) {
	var errs []error
	p, perr := ParsePeriod(period)
	if perr != nil {
		errs = append(errs, perr)
	}
	var f planFile
	if err := yamlx.DecodeStrict(data, &f); err != nil {
		return nil, errors.Join(append(errs, err)...)
	}
	if len(f.Reports) == 0 {
		errs = append(errs, errors.New("reports: the plan lists no reports"))
	}
	plan := &Plan{Period: p, OnComplete: f.OnComplete, OnFailure: f.OnFailure}
	for _, st := range []struct {
		name string
		step *Step
	}{{"on_complete", f.OnComplete}, {"on_failure", f.OnFailure}} {
		if st.step != nil {
			for _, msg := range st.step.Problems(st.name) {
				errs = append(errs, errors.New(msg))
			}
		}
	}
	seen := map[string]int{}
	for i, e := range f.Reports {
		label := fmt.Sprintf("reports[%d] %s", i, quote.Value(e.Name))
		if prev, dup := seen[e.Name]; dup {
			errs = append(errs, fmt.Errorf("%s: listed twice (also reports[%d])", label, prev))
			continue
		}
		seen[e.Name] = i
		if _, ok := cat.Get(e.Name); !ok {
			errs = append(errs, fmt.Errorf("%s: unknown report (catalog: %q)", label, cat.Names()))
			continue
		}
		if e.Tier != "" && !pol.Has(e.Tier) {
			// Said here rather than by Resolve, whose message quotes the
			// tier whole.
			errs = append(errs, fmt.Errorf("%s: %w %s (tiers, highest first: %q)", label, priority.ErrUnknownTier, quote.Value(e.Tier), pol.Tiers()))
			continue
		}
		tier, err := pol.Resolve(e.Name, e.Tier)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", label, err))
			continue
		}
		plan.Entries = append(plan.Entries, PlannedReport{Name: e.Name, Tier: tier})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return plan, nil
}
