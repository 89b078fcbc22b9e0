package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// TestMonthEndRun: month-end starts a run, -wait follows it to its end and
// its completion step (the bundle) runs once; runs and run show say what
// the handlers did; cancelling the ended run changes nothing (exit 0); an
// unknown run is exit 2.
func TestMonthEndRun(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	startWorker(t, cfg)
	plan := writePlan(t, "reports:\n  - name: vat-return\n  - name: trial-balance\n  - name: customer-cohorts\non_complete:\n  job_type: report:bundle\n  tier: regulatory\n  payload: {notify: finance@example.com}\n")
	code, stdout, stderr := enqueue(t, "-config", cfg, "month-end", "-plan", plan, "-period", "2026-10", "-wait", "-poll", "50ms")
	require.Equal(t, 0, code, stderr)
	m := regexp.MustCompile(`run (month-end-2026-10-[0-9a-f]{8}) \(enqueue run show `).FindStringSubmatch(stdout)
	require.NotNil(t, m, stdout)
	id := m[1]
	require.Contains(t, stdout, "month-end finished in ")
	require.Contains(t, stdout, ": 3 completed, 0 failed\nenqueued: on_complete report:bundle\n")

	code, stdout, stderr = enqueue(t, "-config", cfg, "run", "show", id, "-json")
	require.Equal(t, 0, code, stderr)
	var info queues.RunInfo
	require.NoError(t, json.Unmarshal([]byte(stdout), &info))
	require.Equal(t, queues.RunSucceeded, info.State)
	require.Equal(t, 3, info.Succeeded)
	require.Equal(t, 3, info.Total())
	require.Equal(t, "2026-10", info.Period)
	require.Equal(t, "complete", info.Fired)
	require.Equal(t, "someone@", info.StartedBy[:len("someone@")], "who started it: $USER (unset here) at the host")

	// The bundle writes the month's manifest, naming the run. -wait ends
	// once the bundle is enqueued; it runs in the worker after that (a
	// loaded CI run read the file before the bundle had run).
	loaded, err := app.Load(cfg, nil)
	require.NoError(t, err)
	manifest := filepath.Join(loaded.OutputDir, "month-end_2026-10.json")
	testwait.For(t, 30*time.Second, "the bundle to write the manifest", func() bool {
		_, err := os.Stat(manifest)
		return err == nil
	})
	data, err := os.ReadFile(manifest)
	require.NoError(t, err)
	var man handlers.Manifest
	require.NoError(t, json.Unmarshal(data, &man))
	require.Equal(t, id, man.Run.ID)
	require.Equal(t, "finance@example.com", man.Notify)
	require.Equal(t, 3, man.Run.Counts.Succeeded)
	require.Len(t, man.Files, 3)

	code, stdout, stderr = enqueue(t, "-config", cfg, "run", "show", id)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "run "+id+": succeeded\n")
	require.Contains(t, stdout, "on_complete: report:bundle (enqueued)")
	require.Regexp(t, `\nall +3 +0 +0 +3 +0 +0 +0\n`, stdout)

	code, stdout, stderr = enqueue(t, "-config", cfg, "runs")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, id+` +month-end +2026-10 +succeeded +3/3 +0 `, stdout)

	code, stdout, stderr = enqueue(t, "-config", cfg, "run", "cancel", id)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "run "+id+" had already ended (")
	require.Contains(t, stdout, "): nothing changed\n")

	for _, verb := range []string{"show", "wait", "cancel"} {
		code, stdout, stderr = enqueue(t, "-config", cfg, "run", verb, "no-such-run")
		require.Equal(t, 2, code, verb)
		require.Empty(t, stdout)
		require.Equal(t, `enqueue run: no run "no-such-run" (enqueue runs lists the recent ones; a run's record is kept 168h0m0s after it ends)`+"\n", stderr)
	}
	code, _, stderr = enqueue(t, "-config", cfg, "run", "stop", id)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `unknown action "stop" (show, wait or cancel)`)
}

// TestMonthEndStepRoutedNowhere: a plan whose on_complete job type no pool
// serves is refused before anything is enqueued (exit 2), and so is a
// schedule with one, at load, with the config's other problems.
func TestMonthEndStepRoutedNowhere(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	plan := writePlan(t, "reports:\n  - name: vat-return\non_complete:\n  job_type: finance:notify\non_failure:\n  job_type: report:bundle\n  tier: urgent\n")
	code, stdout, stderr := enqueue(t, "-config", cfg, "month-end", "-plan", plan, "-period", "2026-10")
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, `on_complete: job type "finance:notify" is routed to no pool (job types: `)
	require.Contains(t, stderr, `on_failure: tier "urgent": pool "batch" does not serve it`)
	require.Contains(t, stderr, "nothing was enqueued")
	runsOut := func() string {
		code, stdout, stderr := enqueue(t, "-config", cfg, "runs", "-json")
		require.Equal(t, 0, code, stderr)
		return stdout
	}
	require.Equal(t, "[]\n", runsOut(), "no run was started")

	bad := apptest.Config(t, r, "schedules:\n  - name: me\n    plan: "+plan+"\n    cron: \"0 2 1 * *\"\n    on_complete:\n      job_type: nowhere\n")
	code, _, stderr = enqueue(t, "-config", bad, "run", "cancel", "x")
	require.Equal(t, 2, code)
	for _, want := range []string{`schedule "me": on_complete: job type "nowhere" is routed to no pool`, `schedule "me": on_failure: tier "urgent": pool "batch" does not serve it`} {
		require.True(t, strings.Contains(stderr, want), "%q in %s", want, stderr)
	}
}

// An interrupt that lands while a poll reads Redis stops the watching with
// its line, whatever the read returned (the cancelled call's error, say),
// as one that lands between polls does.
func TestWatchingInterruptedWhileReading(t *testing.T) {
	for _, readErr := range []error{nil, context.Canceled, errors.New("redis: connection pool timeout")} {
		ctx, cancel := context.WithCancel(context.Background())
		var out bytes.Buffer
		err := pollUntil(ctx, env{stdout: &out}, time.Hour, "the reports stay queued", func() (bool, error) {
			cancel()
			return false, readErr
		})
		require.ErrorIs(t, err, context.Canceled, "read error: %v", readErr)
		require.Equal(t, "stopped watching; the reports stay queued\n", out.String(), "read error: %v", readErr)
	}
}
