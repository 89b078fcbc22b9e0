package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
)

// scheduleConfig is a test config with an enabled month-end schedule and a
// disabled one, both on the shipped ten-report plan.
func scheduleConfig(t *testing.T) string {
	t.Helper()
	r := testredis.New(t)
	plan := apptest.RepoPath("configs/month-end.yaml")
	return apptest.Config(t, r, fmt.Sprintf(`schedules:
  - name: month-end
    plan: %s
    cron: "0 2 1 * *"
    timezone: Europe/Berlin
  - name: quarter-end
    plan: %s
    cron: "0 3 1 1,4,7,10 *"
    enabled: false
`, plan, plan))
}

func TestScheduleRunAtMostOnce(t *testing.T) {
	t.Parallel()
	cfg := scheduleConfig(t)
	code, stdout, stderr := enqueue(t, "-config", cfg, "schedule", "run", "month-end", "-period", "2026-10")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^schedule month-end: run for 2026-10 enqueued 10 of 10 reports \(0 already queued, running or done; 0 refused\) \(recorded as run manual-\S+\)\n$`, stdout)
	require.Equal(t, 10, pendingReports(status(t, cfg)))

	code, stdout, stderr = enqueue(t, "-config", cfg, "schedule", "run", "month-end", "-period", "2026-10")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^schedule month-end: run for 2026-10 enqueued nothing new: all 10 reports are already queued, running or done \(recorded as run manual-\S+\)\n$`, stdout)
	require.Equal(t, 10, pendingReports(status(t, cfg)), "the second run enqueued nothing")

	// A disabled schedule runs by hand; NAME may follow the flags.
	code, stdout, stderr = enqueue(t, "-config", cfg, "schedule", "run", "-period", "2026-09", "quarter-end")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "schedule quarter-end: run for 2026-09 enqueued 10 of 10 reports")
	require.Equal(t, 20, pendingReports(status(t, cfg)))
}

func TestScheduleRunUsageErrors(t *testing.T) {
	t.Parallel()
	cfg := scheduleConfig(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown schedule", []string{"schedule", "run", "year-end"}, `enqueue schedule: unknown schedule "year-end" (schedules: month-end, quarter-end)`},
		{"no name", []string{"schedule", "run"}, "enqueue schedule: missing schedule name"},
		{"no subcommand", []string{"schedule"}, "enqueue schedule: missing subcommand"},
		{"unknown subcommand", []string{"schedule", "start", "month-end"}, `enqueue schedule: unknown subcommand "start"`},
		{"bad period", []string{"schedule", "run", "month-end", "-period", "2026-13"}, `period "2026-13" must be a month written YYYY-MM`},
		{"two names", []string{"schedule", "run", "month-end", "quarter-end"}, `unexpected argument "quarter-end"`},
		{"bad runs", []string{"schedules", "-runs", "0"}, "-runs must be >= 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := enqueue(t, append([]string{"-config", cfg}, tc.args...)...)
			require.Equal(t, 2, code, stderr)
			require.Contains(t, stderr, tc.want)
		})
	}
	require.Zero(t, pendingReports(status(t, cfg)), "nothing was enqueued")

	// A config without schedules says so.
	plain := apptest.Config(t, testredis.New(t), "")
	code, _, stderr := enqueue(t, "-config", plain, "schedule", "run", "month-end")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "has no schedules")
	code, stdout, _ := enqueue(t, "-config", plain, "schedules")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "no schedules in ")
}

func TestSchedulesAndStatus(t *testing.T) {
	t.Parallel()
	cfg := scheduleConfig(t)
	code, stdout, stderr := enqueue(t, "-config", cfg, "schedules")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "SCHEDULE     ENABLED  CRON              TIMEZONE       PERIOD    REPORTS  CATCH-UP  NEXT RUN\n")
	require.Regexp(t, `month-end    yes      0 2 1 \* \*         Europe/Berlin  previous  10       24h       \d{4}-\d\d-01 02:00 CES?T \(for \d{4}-\d\d\)\n`, stdout)
	require.Contains(t, stdout, "quarter-end  no       0 3 1 1,4,7,10 *  UTC            previous  10       24h       - (disabled)\n")
	require.Contains(t, stdout, "month-end: plan "+apptest.RepoPath("configs/month-end.yaml")+" (10 reports); newest runs first\n  no runs yet\n")

	code, _, stderr = enqueue(t, "-config", cfg, "schedule", "run", "month-end", "-period", "2026-10")
	require.Equal(t, 0, code, stderr)
	code, stdout, stderr = enqueue(t, "-config", cfg, "schedules")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `  RUN\s+TRIGGER\s+PERIOD\s+STATE\s+ENQUEUED\s+ALREADY\s+REFUSED\s+STARTED \(UTC\)\s+TOOK\s+CLAIMED BY\n  manual\s+manual\s+2026-10\s+done\s+10\s+0\s+0\s+\S+ \S+\s+\S+\s+enqueue@\S+:\d+\n`, stdout)

	code, stdout, stderr = enqueue(t, "-config", cfg, "status")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "SCHEDULE     NEXT RUN")
	require.Regexp(t, `month-end\s+\d{4}-\d\d-01 02:00 CES?T \(for \d{4}-\d\d\)\s+manual, \S+ \S+ UTC\s+2026-10\s+done\s+10\s+0\s+0\n`, stdout)
	require.Regexp(t, `quarter-end\s+- \(disabled\)\s+never`, stdout)

	st := status(t, cfg)
	require.Len(t, st.Schedules, 2)
	me := st.Schedules[0]
	require.Equal(t, "month-end", me.Name)
	require.True(t, me.Enabled)
	require.NotNil(t, me.NextRun)
	require.NotNil(t, me.LastRun)
	require.Equal(t, "2026-10", me.LastRun.Period)
	require.Equal(t, 10, me.LastRun.Enqueued)
	require.Equal(t, "done", me.LastRun.State)
	require.Nil(t, st.Schedules[1].NextRun, "a disabled schedule has no next run")
	require.Nil(t, st.Schedules[1].LastRun)

	code, stdout, _ = enqueue(t, "-config", cfg, "schedules", "-json", "-runs", "1")
	require.Equal(t, 0, code)
	var out struct {
		Schedules []app.ScheduleStatus `json:"schedules"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &out))
	require.Len(t, out.Schedules[0].Runs, 1)
	require.Equal(t, "manual", out.Schedules[0].Runs[0].Trigger)
	require.True(t, strings.HasPrefix(out.Schedules[0].Runs[0].ClaimedBy, "enqueue@"))
}

// A scheduled plan the batch pool's door refuses enqueues nothing, exits 3
// and records every report as refused.
func TestScheduleRunRefusedAtTheDoor(t *testing.T) {
	t.Parallel()
	cfg := scheduleConfig(t)
	apptest.ReplaceInConfig(t, cfg, "    max_retry: 2\n", "    max_retry: 2\n    max_backlog: 5\n")
	code, stdout, stderr := enqueue(t, "-config", cfg, "schedule", "run", "month-end", "-period", "2026-10")
	require.Equal(t, 3, code, stdout+stderr)
	require.Contains(t, stderr, `pool "batch" is full`)
	require.Contains(t, stderr, "nothing was enqueued")
	st := status(t, cfg)
	require.Zero(t, pendingReports(st))
	require.Len(t, st.Schedules, 2)
	last := st.Schedules[0].LastRun
	require.NotNil(t, last)
	require.Equal(t, "failed", string(last.State))
	require.Equal(t, 10, last.Counts.Refused)
	require.Zero(t, last.Counts.Enqueued)
}
