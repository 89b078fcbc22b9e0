package reliability

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/schedule"
	"github.com/lci-labs/compartment/internal/testwait"
)

// TestScheduledMonthEndThreeProcesses runs three worker processes whose
// schedule clock (the worker's test-only COMPARTMENT_TEST_CLOCK_OFFSET)
// reaches 02:00 on 1 November in Berlin about 15 s after they start: the
// month-end plan is enqueued by one of them, once, recorded once, and
// every report completes. Then all three stop cleanly.
func TestScheduledMonthEndThreeProcesses(t *testing.T) {
	skipShort(t, "three worker processes firing one month-end schedule, about 25 s")
	t.Parallel()
	r := startRedis(t)
	cfg, ns := config(t, r, "shutdown_timeout: 5s", fmt.Sprintf(`shutdown_timeout: 5s
schedules:
  - name: month-end
    plan: %s
    cron: "0 2 1 * *"
    timezone: Europe/Berlin
    catch_up: 1h`, apptest.RepoPath("configs/month-end.yaml")))
	fire := time.Date(2026, 11, 1, 1, 0, 0, 0, time.UTC) // 02:00 CET
	const lead = 15 * time.Second
	offset := fire.Sub(time.Now().Add(lead))
	env := []string{"COMPARTMENT_TEST_CLOCK_OFFSET=" + offset.String()}
	workers := make([]*proc, 3)
	for i := range workers {
		workers[i] = startEnv(t, env, bins.worker, "-config", cfg)
	}
	for _, w := range workers {
		w.waitServing(r, 3, 60*time.Second)
		require.Contains(t, w.out.String(), "TEST-ONLY clock offset in effect")
	}

	store := schedule.NewStore(r.Client, ns)
	ctx := context.Background()
	var recs []schedule.Record
	testwait.For(t, lead+30*time.Second, "the month-end run to be recorded done", every(100*time.Millisecond, func() bool {
		var err error
		recs, err = store.Runs(ctx, "month-end", 0)
		require.NoError(t, err)
		return len(recs) > 0 && recs[0].State == schedule.StateDone
	}))
	testwait.For(t, 60*time.Second, "every report of the plan to complete", every(100*time.Millisecond, func() bool {
		return countStates(jobStates(t, r.Client, ns))[asynq.TaskStateCompleted] == 10
	}))
	states := jobStates(t, r.Client, ns)
	require.Len(t, states, 10, "ten report jobs, no more")
	for id, ti := range states {
		require.Equal(t, asynq.TaskStateCompleted, ti.State, id)
		require.True(t, strings.HasSuffix(id, ":2026-10"), "October's reports: %s", id)
	}

	recs, err := store.Runs(ctx, "month-end", 0)
	require.NoError(t, err)
	require.Len(t, recs, 1, "one run record")
	rec := recs[0]
	require.Equal(t, "2026-11-01T01:00:00Z", rec.ID)
	require.Equal(t, "2026-10", rec.Period)
	require.Equal(t, schedule.Counts{Enqueued: 10}, rec.Counts)
	require.Equal(t, 1, rec.Attempt)
	// "schedule" when the workers were up before the fire time (15 s of
	// lead); "catch-up" only if the machine took longer than that to
	// start them.
	t.Logf("run %s: trigger %s, claimed by %s", rec.ID, rec.Trigger, rec.ClaimedBy)
	starts := 0
	for _, w := range workers {
		starts += strings.Count(w.out.String(), "schedule: run starting") + strings.Count(w.out.String(), "schedule: catching up")
	}
	require.Equal(t, 1, starts, "one process ran the month-end")

	code, out := enqueue(t, cfg, "status")
	require.Equal(t, 0, code, out)
	require.Regexp(t, `month-end\s+\S+ \S+ \S+ \(for \d{4}-\d\d\)\s+2026-11-01 02:00 CET(?: \(catch-up\))?\s+2026-10\s+done\s+10\s+0\s+0`, out)

	for _, w := range workers {
		w.signal(syscall.SIGTERM)
	}
	for _, w := range workers {
		require.Equal(t, 0, w.wait(30*time.Second), w.out.String())
	}
}
