package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/testredis"
)

// TestBadSchedulesExit2: every bad schedule setting is named, with the
// other config problems, and the worker does not start.
func TestBadSchedulesExit2(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	plan := apptest.RepoPath("configs/month-end.yaml")
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	path := apptest.Config(t, r, `schedules:
  - {name: bad-cron, plan: `+plan+`, cron: "0 2 31 2 * *"}
  - {name: bad-zone, plan: `+plan+`, cron: "0 2 1 * *", timezone: Moon/Tranquility}
  - {name: no-plan, plan: `+missing+`, cron: "0 2 1 * *"}
  - {name: bad-period, plan: `+plan+`, cron: "0 2 1 * *", period: next}
  - {name: bad-period, plan: `+plan+`, cron: "0 2 1 * *"}
`)
	apptest.ReplaceInConfig(t, path, "size: 3", "size: 0")
	code, stdout, stderr := runWorker(t, "-config", path)
	require.Equal(t, 2, code, stderr)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "worker: config "+path+": 6 problems:\n")
	for _, w := range []string{
		`  - schedule "bad-cron": cron "0 2 31 2 * *": expected exactly 5 fields, found 6`,
		`  - schedule "bad-zone": timezone "Moon/Tranquility": unknown time zone`,
		`  - schedule "no-plan": plan: open ` + missing + `: no such file or directory`,
		`  - schedule "bad-period": period "next": use previous (the month before the run) or current (the month of the run)`,
		`  - schedule "bad-period": listed twice (also schedules[3])`,
		`  - pool "order": size must be >= 1, got 0`,
	} {
		require.Contains(t, stderr, w)
	}
}

func TestBadTestClockOffsetExits2(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	path := apptest.Config(t, r, "")
	var out, errOut apptest.SyncBuffer
	env := func(k string) string {
		if k == testClockOffsetEnv {
			return "soon"
		}
		return ""
	}
	code := run(context.Background(), cli.Env{Args: []string{"-config", path}, Stdout: &out, Stderr: &errOut, Getenv: env})
	require.Equal(t, 2, code)
	require.Contains(t, errOut.String(), `worker: COMPARTMENT_TEST_CLOCK_OFFSET="soon": time: invalid duration "soon"`)
}
