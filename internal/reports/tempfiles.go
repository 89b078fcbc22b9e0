package reports

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Run writes a report to a temporary file in the output directory, named
// "." + FileName + ".tmp-" + random digits, and renames it into place. A
// process killed mid-report (kill -9, OOM, power cut) cannot remove its
// temporary file; the functions here find such leftovers by that name and
// nothing else.

// tempName matches the name of every temporary file Run creates, for any
// report and period: ".<report>_<YYYY-MM>.csv.tmp-<digits>".
var tempName = regexp.MustCompile(`^\.[A-Za-z0-9][A-Za-z0-9._-]*_[0-9]{4}-[0-9]{2}\.csv\.tmp-[0-9]+$`)

// tempPrefix is the start of the names of the temporary files of one report
// and period; random digits follow it.
func tempPrefix(report string, p Period) string { return "." + FileName(report, p) + ".tmp-" }

// isTempOf reports whether name is a temporary file of the report and
// period whose names start with prefix.
func isTempOf(name, prefix string) bool {
	digits, ok := strings.CutPrefix(name, prefix)
	if !ok || digits == "" {
		return false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// createTemp creates a new temporary file for report and period in dir. It
// is os.CreateTemp but for the mode: the file gets 0666 less the process's
// umask, as os.Create would give it (0644 under the usual umask 022), instead
// of os.CreateTemp's 0600. A report is an ordinary output file that other
// users or tools may need to read, and the umask is where an operator who
// wants report files private says so.
func createTemp(dir, report string, p Period) (*os.File, error) {
	prefix := filepath.Join(dir, tempPrefix(report, p))
	for range 10000 {
		f, err := os.OpenFile(prefix+strconv.FormatUint(uint64(rand.Uint32()), 10), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if !errors.Is(err, os.ErrExist) {
			return f, err
		}
	}
	return nil, &os.PathError{Op: "createtemp", Path: prefix + "*", Err: os.ErrExist}
}

// removeLeftovers removes the temporary files of report and period in dir:
// what earlier runs that were killed mid-report left behind. Errors are
// ignored, as a leftover that cannot be removed must not stop the report;
// CleanStaleTemp reports them.
//
// A run of the same report and period still in progress elsewhere (a job
// redelivered while its first worker was stalled) loses its temporary file
// too; it then fails at the rename, and this run writes the file.
func removeLeftovers(dir, report string, p Period) int {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	prefix := tempPrefix(report, p)
	n := 0
	for _, e := range entries {
		if e.Type().IsRegular() && isTempOf(e.Name(), prefix) {
			if os.Remove(filepath.Join(dir, e.Name())) == nil {
				n++
			}
		}
	}
	return n
}

// CleanStaleTemp removes from dir the temporary files that Run leaves
// behind when its process is killed mid-report, if they were last modified
// more than olderThan ago. It removes only regular files named like Run's
// temporary files (".<report>_<YYYY-MM>.csv.tmp-<digits>"), never reports
// or other files, and does not descend into subdirectories. olderThan should
// exceed the time the slowest report takes to write, so that files of runs
// in progress are kept. A missing dir has nothing to clean.
//
// It returns how many files it removed; on failure, it returns those it
// removed so far and an error naming the file it could not remove or
// inspect, having tried all the others.
func CleanStaleTemp(dir string, olderThan time.Duration) (removed int, err error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reports: clean temporary files: %w", err)
	}
	cutoff := time.Now().Add(-olderThan)
	var errs []error
	for _, e := range entries {
		if !e.Type().IsRegular() || !tempName.MatchString(e.Name()) {
			continue
		}
		info, err := e.Info()
		if errors.Is(err, os.ErrNotExist) {
			continue // renamed or removed since ReadDir
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !info.ModTime().Before(cutoff) {
			continue
		}
		switch err := os.Remove(filepath.Join(dir, e.Name())); {
		case err == nil:
			removed++
		case !errors.Is(err, os.ErrNotExist):
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return removed, fmt.Errorf("reports: clean temporary files: %w", errors.Join(errs...))
	}
	return removed, nil
}

// syncDir flushes dir's entries to disk, so that a file just renamed into
// it is still there after a power cut. File systems that cannot sync a
// directory say so with EINVAL or ENOTSUP; there is nothing more to do then.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, errors.ErrUnsupported) {
		err = nil
	}
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
