package reports

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/lci-labs/compartment/internal/yamlx"
	"github.com/lci-labs/compartment/priority"
)

// PrioritiesFile is the on-disk shape of the business's priorities file
// (configs/priorities.yaml): the tiers, highest first, the default tier and
// which tier each report belongs to.
//
//	tiers: [regulatory, close, management, adhoc]   # highest first
//	default: adhoc
//	reports:
//	  vat-return: regulatory
//	  trial-balance: close
type PrioritiesFile struct {
	// Tiers lists the tier names, highest priority first. Required.
	Tiers []string `yaml:"tiers"`
	// Default is the tier of a report that has no entry in Reports.
	// Required; must be one of Tiers.
	Default string `yaml:"default"`
	// Reports maps a report name to its tier. Optional.
	Reports map[string]string `yaml:"reports"`
}

// LoadPriorities reads and validates the priorities file at path.
func LoadPriorities(path string) (*priority.Policy, error) {
	data, err := yamlx.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("priorities: %w", err)
	}
	p, err := ParsePriorities(data)
	if err != nil {
		return nil, fmt.Errorf("priorities file %s: %w", path, err)
	}
	return p, nil
}

// ParsePriorities decodes a priorities file strictly (unknown keys are
// errors) and validates it, reporting every problem.
func ParsePriorities(data []byte) (*priority.Policy, error) {
	var f PrioritiesFile
	if err := yamlx.DecodeStrict(data, &f); err != nil {
		return nil, err
	}
	var errs []error
	for _, name := range sortedKeys(f.Reports) {
		if err := ValidateName(name); err != nil {
			errs = append(errs, fmt.Errorf("reports: %w", err))
		}
	}
	p, err := priority.New(priority.Config{Tiers: f.Tiers, Default: f.Default, Assign: f.Reports})
	if err != nil {
		// The policy's messages about assignments name the report; say
		// where they come from in the file.
		for _, line := range strings.Split(err.Error(), "\n") {
			if strings.HasPrefix(line, `"`) {
				line = "reports: report " + line
			}
			errs = append(errs, errors.New(line))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

func sortedKeys(m map[string]string) []string {
	return slices.Sorted(maps.Keys(m))
}
