package reports

import (
	"fmt"
	"regexp"
	"strings"
)

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidateName reports whether name is usable as a report name: it becomes
// part of file names and job IDs, so path separators, "..", spaces and other
// punctuation are rejected.
func ValidateName(name string) error {
	if !namePattern.MatchString(name) || strings.Contains(name, "..") {
		return fmt.Errorf("report name %q is invalid: use letters, digits, '.', '_' and '-' (no path separators, no \"..\"), starting with a letter or digit, at most 128 characters", name)
	}
	return nil
}
