package reports

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/lci-labs/compartment/internal/quote"
)

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidateName reports whether name is usable as a report name: it becomes
// part of file names and job IDs, so path separators, "..", spaces and other
// punctuation are rejected. The error quotes name cut to quote.Max bytes.
func ValidateName(name string) error {
	if !namePattern.MatchString(name) || strings.Contains(name, "..") {
		return fmt.Errorf("report name %s is invalid: use letters, digits, '.', '_' and '-' (no path separators, no \"..\"), starting with a letter or digit, at most 128 characters", quote.Value(name))
	}
	return nil
}
