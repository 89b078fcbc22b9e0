//go:build unix

package reports_test

import (
	"context"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/reports"
)

// TestReportFileModeFollowsUmask: a report file gets the mode os.Create
// would give it, not os.CreateTemp's 0600, so the umask decides who may
// read reports.
func TestReportFileModeFollowsUmask(t *testing.T) {
	for _, tc := range []struct {
		umask int
		want  os.FileMode
	}{
		{0o022, 0o644},
		{0o027, 0o640},
		{0o077, 0o600},
	} {
		t.Run(tc.want.String(), func(t *testing.T) {
			old := syscall.Umask(tc.umask) // process-wide: this package's tests do not run in parallel
			res, err := reports.Run(context.Background(), sqliteConn(t), periodReport, mustPeriod(t, "2026-10"), t.TempDir())
			syscall.Umask(old)
			require.NoError(t, err)
			info, err := os.Stat(res.Path)
			require.NoError(t, err)
			require.Equal(t, tc.want, info.Mode().Perm())
		})
	}
}
