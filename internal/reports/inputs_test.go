package reports_test

import (
	"context"
	"os"
	"path/filepath"
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
