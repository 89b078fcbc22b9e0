package reports_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/reports"
)

// within runs fn and fails the test if it has not returned by the
// deadline: reading an endless file used to grow without bound.
func within[T any](t *testing.T, d time.Duration, fn func() T) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	done := make(chan T, 1)
	go func() { done <- fn() }()
	select {
	case v := <-done:
		return v
	case <-ctx.Done():
		t.Fatalf("still reading after %s", d)
		panic("unreachable")
	}
}

// TestLoadRefusesHugeFiles: the catalog and the plan, like the config and
// the priorities, are refused past yamlx.MaxFileSize, /dev/zero included,
// without reading them into memory.
func TestLoadRefusesHugeFiles(t *testing.T) {
	t.Parallel()
	big := filepath.Join(t.TempDir(), "big.yaml")
	require.NoError(t, os.WriteFile(big, make([]byte, 5<<20), 0o600))
	cat, err := reports.LoadCatalog(apptest.RepoPath("configs/reports.yaml"))
	require.NoError(t, err)
	pol, err := reports.LoadPriorities(apptest.RepoPath("configs/priorities.yaml"))
	require.NoError(t, err)

	paths := []string{big}
	if _, err := os.Stat("/dev/zero"); err == nil {
		paths = append(paths, "/dev/zero")
	}
	for _, path := range paths {
		t.Run("catalog "+path, func(t *testing.T) {
			err := within(t, 10*time.Second, func() error { _, err := reports.LoadCatalog(path); return err })
			require.ErrorContains(t, err, "report catalog: "+path+" is larger than the limit of 4 MiB")
		})
		t.Run("plan "+path, func(t *testing.T) {
			err := within(t, 10*time.Second, func() error { _, err := reports.LoadPlan(path, "2026-10", cat, pol); return err })
			require.ErrorContains(t, err, "plan: "+path+" is larger than the limit of 4 MiB")
		})
	}
}

// TestHugeValuesAreCut: a value that came from input is quoted in an error
// cut to quote.Max bytes with its length, never whole (a 10 MB report name
// in a job payload was copied into the job's error, the log and Redis).
func TestHugeValuesAreCut(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat("x", 10<<20)
	cat, err := reports.ParseCatalog([]byte("reports:\n  - name: vat\n    query: x $1 $2\n"))
	require.NoError(t, err)
	pol, err := reports.ParsePriorities([]byte("tiers: [regulatory, adhoc]\ndefault: adhoc\n"))
	require.NoError(t, err)
	big := strings.Repeat("y", 1<<20) // a plan or catalog file is at most 4 MiB

	cases := []struct {
		name string
		err  func() error
		want []string
	}{
		{"report name", func() error { return reports.ValidateName(huge) },
			[]string{`report name "xxxx`, `... (10485760 bytes) is invalid: use letters`}},
		{"period", func() error { _, err := reports.ParsePeriod(huge); return err },
			[]string{`period "xxxx`, `... (10485760 bytes) must be a month written YYYY-MM, like 2026-10`}},
		{"plan entry name", func() error {
			_, err := reports.ParsePlan([]byte("reports:\n  - name: "+big+"\n"), "2026-10", cat, pol)
			return err
		}, []string{`reports[0] "yyyy`, `... (1048576 bytes): unknown report (catalog: ["vat"])`}},
		{"plan entry tier", func() error {
			_, err := reports.ParsePlan([]byte("reports:\n  - name: vat\n    tier: "+big+"\n"), "2026-10", cat, pol)
			return err
		}, []string{`reports[0] "vat": priority: unknown tier "yyyy`, `... (1048576 bytes) (tiers, highest first: ["regulatory" "adhoc"])`}},
		{"plan period", func() error {
			_, err := reports.ParsePlan([]byte("reports:\n  - name: vat\n"), huge, cat, pol)
			return err
		}, []string{`period "xxxx`, `... (10485760 bytes) must be a month`}},
		{"catalog name", func() error {
			_, err := reports.ParseCatalog([]byte("reports:\n  - name: " + big + "\n    query: x $1 $2\n"))
			return err
		}, []string{`reports[0]: report name "yyyy`, `... (1048576 bytes) is invalid`}},
		{"catalog format", func() error {
			_, err := reports.ParseCatalog([]byte("reports:\n  - name: a\n    query: x $1 $2\n    format: " + big + "\n"))
			return err
		}, []string{`report "a": format must be "csv", got "yyyy`, `... (1048576 bytes)`}},
		{"priorities report name", func() error {
			_, err := reports.ParsePriorities([]byte("tiers: [a]\ndefault: a\nreports:\n  ? " + big + "\n  : a\n"))
			return err
		}, []string{`reports: report name "yyyy`, `... (1048576 bytes) is invalid`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			require.Error(t, err)
			msg := err.Error()
			require.Less(t, len(msg), 400, "%.400s", msg)
			for _, w := range tc.want {
				require.Contains(t, msg, w)
			}
		})
	}
}
