package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/priority"
	"github.com/lci-labs/compartment/queues"
)

// TestPlanSummaryHeadline: the headline above the per-tier table says what
// the enqueue did, so a plan that was already queued does not read as
// "enqueued".
func TestPlanSummaryHeadline(t *testing.T) {
	t.Parallel()
	pol, err := priority.New(priority.Config{Tiers: []string{"regulatory", "adhoc"}, Default: "adhoc"})
	require.NoError(t, err)
	cfg := &app.Config{Policy: pol}
	result := func(outcomes ...queues.EnqueueOutcome) app.PlanResult {
		res := app.PlanResult{Outcomes: outcomes, Took: 10 * time.Millisecond}
		for i := range outcomes {
			tier := "regulatory"
			if i%2 == 1 {
				tier = "adhoc"
			}
			res.Jobs = append(res.Jobs, app.ReportJob{Tier: tier})
		}
		return res
	}
	const (
		n = queues.Enqueued
		d = queues.Duplicate
		r = queues.Replaced
	)
	for _, tc := range []struct {
		name string
		res  app.PlanResult
		want string
	}{
		{"all new", result(n, n, n, n),
			"month-end plan of 4 reports: 4 new reports enqueued (in 10ms, 400 reports/s)\n" +
				"TIER        NEW  ALREADY QUEUED  RERUN\nregulatory  2    0               0\nadhoc       2    0               0\n"},
		{"all already queued", result(d, d, d, d, d, d, d, d, d, d),
			"month-end plan of 10 reports: 0 new reports enqueued, 10 already queued or running, left as they are (in 10ms, 1000 reports/s)\n" +
				"TIER        NEW  ALREADY QUEUED  RERUN\nregulatory  0    5               0\nadhoc       0    5               0\n"},
		{"mixed", result(n, d, r, d),
			"month-end plan of 4 reports: 1 new report enqueued, 1 enqueued again (their previous run had finished), 2 already queued or running, left as they are (in 10ms, 400 reports/s)\n" +
				"TIER        NEW  ALREADY QUEUED  RERUN\nregulatory  1    0               1\nadhoc       0    2               0\n"},
		{"one report", result(d),
			"month-end plan of 1 report: 0 new reports enqueued, 1 already queued or running, left as they are (in 10ms, 100 reports/s)\n" +
				"TIER        NEW  ALREADY QUEUED  RERUN\nregulatory  0    1               0\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			printPlanSummary(&out, cfg, tc.res)
			require.Equal(t, tc.want, out.String())
		})
	}
}
