package demo_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/demo"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/web"
)

// config loads the test config (apptest.Config: pools order 3, search 2,
// batch 2 on 10 database connections, so the shared pool of the BEFORE
// phase has 10 slots) with every report holding its connection at least
// reportMinDuration, on a small seed: seeding 3000 orders takes seconds
// under -race.
func config(t *testing.T, reportMinDuration string) *app.Config {
	t.Helper()
	path := apptest.Config(t, testredis.New(t), "report_min_duration: "+reportMinDuration+"\n")
	apptest.ReplaceInConfig(t, path, "seed_orders: 3000", "seed_orders: 300")
	cfg, err := app.Load(path, nil)
	require.NoError(t, err)
	return cfg
}

// TestDemo runs the demo, once with the walls only and once with both
// phases. The runs do not run in parallel: each keeps two cores busy, and
// its timings are what it checks. The traffic is light (10 orders a
// second), so that under -race on a busy machine the order pool keeps up.
func TestDemo(t *testing.T) {
	t.Run("AFTER only: the walls hold and tiers keep their order", func(t *testing.T) {
		var out bytes.Buffer
		s, err := demo.Run(context.Background(), demo.Options{
			Config: config(t, "200ms"), Plan: apptest.RepoPath("configs/month-end.yaml"), Periods: []string{"2026-10"}, SkipOutage: true, SkipSlowdown: true,
			OrdersPerSecond: 10, SearchesPerSecond: 5, Warmup: 700 * time.Millisecond, Out: &out, Refresh: 50 * time.Millisecond,
		})
		require.NoError(t, err, out.String())
		require.Nil(t, s.Outage, "skipped")
		require.True(t, s.WallsHeld(), out.String())
		require.True(t, s.OK(), "with the BEFORE phase skipped, the walls decide")
		w := s.Walls
		require.Equal(t, 10, w.ReportsTotal)
		require.Equal(t, 10, w.ReportsDone)
		require.Zero(t, w.ReportsFailed)
		require.Zero(t, s.Inversions)
		require.Len(t, s.Starts, 10)
		require.Equal(t, "regulatory", s.Starts[0].Tier)
		require.Equal(t, "adhoc", s.Starts[9].Tier)
		require.Len(t, w.Pools, 3)
		for _, p := range w.Pools {
			require.False(t, p.Exceeded(), p.Name)
			require.Positive(t, p.Jobs, p.Name)
			require.Positive(t, p.MaxConcurrent, "%s: seen from inside the handlers", p.Name)
		}
		// 10 reports and the month-end's bundle (its run's on_complete).
		require.Equal(t, demo.PoolResult{Name: "batch", Size: 2, MaxConcurrent: 2, MaxConns: 2, Jobs: 11}, w.Pools[2], "the batch pool filled up")
		require.Len(t, w.Runs, 1)
		require.Regexp(t, `^month-end 2026-10: run month-end-2026-10-[0-9a-f]{8} succeeded, 10/10 reports succeeded; bundle .*month-end_2026-10\.json$`, w.Runs[0])
		require.FileExists(t, w.Runs[0][strings.Index(w.Runs[0], "; bundle ")+len("; bundle "):], "the bundle wrote the month's manifest")
		require.Positive(t, w.OrderBefore.N)
		require.Positive(t, w.OrderDuring.N)
		require.NotContains(t, out.String(), "=== BEFORE")
		require.Contains(t, out.String(), "=== AFTER: walls: order 3, search 2, batch 2 ===")

		var printed bytes.Buffer
		s.Print(&printed)
		require.Contains(t, printed.String(), "tier inversions: 0")
		require.Contains(t, printed.String(), "BEFORE: skipped (-skip-outage): the exit code does not cover it.")
		require.Contains(t, printed.String(), "SLOWDOWN: skipped (-skip-slowdown): the exit code does not cover it.")
		require.Contains(t, printed.String(), "AFTER: the walls held: 10/10 reports completed")
	})

	// The same load twice. BEFORE, one shared pool of 10: twenty reports,
	// each holding its slot and connection 700ms, keep the pool full, and
	// the orders wait behind them. AFTER, with the walls: the reports stay
	// in the batch pool's two slots and orders flow.
	t.Run("BEFORE shows the outage, AFTER does not", func(t *testing.T) {
		const orderTimeout = time.Second
		const outageMin = 4 * time.Second
		out := &apptest.SyncBuffer{}
		cfg := config(t, "700ms")
		cfg.HTTP.Listen = "127.0.0.1:0"
		page := watchDashboard(t, out)
		s, err := demo.Run(context.Background(), demo.Options{
			Config: cfg, Plan: apptest.RepoPath("configs/month-end.yaml"), Periods: []string{"2026-09", "2026-10"},
			OrdersPerSecond: 10, SearchesPerSecond: 5, Warmup: 700 * time.Millisecond, OrderTimeout: orderTimeout,
			Out: out, Refresh: 50 * time.Millisecond, OutageMin: outageMin, SkipSlowdown: true,
		})
		require.NoError(t, err, out.String())
		seen := page.stop()

		// The dashboard showed BEFORE as it happened: the scene named it,
		// with the shared pool's jobs and the connections in use; and its
		// timeline held both phases, BEFORE lasting at least outageMin.
		require.True(t, seen.before, "the page named the BEFORE phase while it ran")
		require.Positive(t, seen.sharedMax, "the page showed jobs in the shared pool during BEFORE")
		require.LessOrEqual(t, seen.sharedMax, 10.0, "never more than the shared pool's 10")
		require.Positive(t, seen.connectionsMax, "the page showed connections in use during BEFORE")
		require.True(t, seen.after, "the page named the AFTER phase")
		// The timeline samples once a second, so the first BEFORE sample can
		// come up to a second after the phase began and the last up to a
		// second before it ended, later still on a busy machine.
		require.GreaterOrEqual(t, seen.beforeSpan, outageMin/2, "BEFORE stayed on the page for most of -outage-min")
		require.True(t, seen.bothOnTimeline, "the timeline held both phases at once")
		var printed bytes.Buffer
		s.Print(&printed)
		t.Log("\n" + printed.String())

		// Observed inside the handlers: the reports took more slots and
		// connections than the walls give them (not always all ten: asynq
		// starts jobs one dequeue at a time, between orders), and order
		// latency climbed past the thresholds.
		before := s.Outage
		require.NotNil(t, before)
		require.True(t, s.OutageReproduced(), printed.String())
		require.Equal(t, 20, before.ReportsDone)
		require.Equal(t, "all jobs", before.Pools[0].Name)
		require.Equal(t, 10, before.Pools[0].Size)
		batch := before.Pools[3]
		require.Equal(t, "batch", batch.Name)
		require.Greater(t, batch.MaxConcurrent, s.Walls.Pools[2].Size)
		require.Greater(t, batch.MaxConns, s.Walls.Pools[2].Size)
		require.Equal(t, 20, batch.Jobs)

		after := s.Walls
		require.True(t, s.WallsHeld(), printed.String())
		require.True(t, s.OK())
		require.Equal(t, 20, after.ReportsDone)
		require.Zero(t, after.OrderBefore.TimedOut+after.OrderDuring.TimedOut, "with the walls no order timed out")
		require.Zero(t, after.OrderDuring.Errors)
		require.Positive(t, after.OrderDuring.N)
		require.Less(t, after.OrderDuring.P99, before.OrderDuring.P99, "with the walls orders did not wait behind the reports")
		require.Equal(t, demo.PoolResult{Name: "batch", Size: 2, MaxConcurrent: 2, MaxConns: 2, Jobs: 22}, after.Pools[2], "20 reports and each month's bundle")
		require.Len(t, after.Runs, 2, "one run per month")

		// Both phases drew a live view, after the legend.
		o := out.String()
		require.Contains(t, o, "the traffic goes on until the phase has run 4s, for the dashboard")
		require.Contains(t, o, "  peak     the most jobs inside at once since the previous view")
		require.Contains(t, o, "=== BEFORE: one shared pool of 10 ===")
		require.Contains(t, o, "[BEFORE] month-end running")
		require.Contains(t, o, "\n    batch jobs       10 ")
		require.Contains(t, o, "=== AFTER: walls: order 3, search 2, batch 2 ===")
		require.Contains(t, o, "[AFTER] month-end running")
		require.Contains(t, printed.String(), "BEFORE: the outage reproduced")
	})
}

// summary is a run's outcome as the side-by-side test prints it.
func summary() demo.Summary {
	return demo.Summary{
		Outage: &demo.Phase{
			Name: "BEFORE", Setup: "one shared pool of 20",
			Pools: []demo.PoolResult{
				{Name: "all jobs", Size: 20, MaxConcurrent: 20, MaxConns: demo.NotCounted, Jobs: 900},
				{Name: "order", Size: 20, MaxConcurrent: 4, MaxConns: 4, Jobs: 500},
				{Name: "batch", Size: 20, MaxConcurrent: 20, MaxConns: 20, Jobs: 40},
			},
			OrderBefore:  demo.Orders{Latency: demo.Latency{N: 120, P50: 50 * time.Millisecond, P99: 130 * time.Millisecond, Max: 150 * time.Millisecond}},
			OrderDuring:  demo.Orders{Latency: demo.Latency{N: 400, P50: 900 * time.Millisecond, P99: 5900 * time.Millisecond, Max: 6 * time.Second}, TimedOut: 150, Errors: 2},
			ReportsTotal: 40, ReportsDone: 40, MonthEndTook: 9 * time.Second,
		},
		Walls: demo.Phase{
			Name: "AFTER", Setup: "walls: order 8, batch 4",
			Pools: []demo.PoolResult{
				{Name: "order", Size: 8, MaxConcurrent: 6, MaxConns: 6, Jobs: 1400},
				{Name: "batch", Size: 4, MaxConcurrent: 4, MaxConns: 4, Jobs: 40},
			},
			OrderBefore:  demo.Orders{Latency: demo.Latency{N: 119, P50: 60 * time.Millisecond, P99: 140 * time.Millisecond, Max: 160 * time.Millisecond}},
			OrderDuring:  demo.Orders{Latency: demo.Latency{N: 1300, P50: 65 * time.Millisecond, P99: 260 * time.Millisecond, Max: 700 * time.Millisecond}},
			ReportsTotal: 40, ReportsDone: 40, MonthEndTook: 33 * time.Second,
		},
		Starts: []demo.ReportStart{
			{Tier: "regulatory", At: 900 * time.Millisecond}, {Tier: "regulatory", At: 3900 * time.Millisecond}, {Tier: "adhoc", At: 22 * time.Second},
		},
		Slowdown: &demo.SlowdownAct{
			Pool: "batch", Min: 1, Max: 4, Window: time.Second, Tolerance: 1.5, Factor: 5, Capacity: 4,
			Warmup: 5 * time.Second, SlowFor: 12500 * time.Millisecond, Took: 36500 * time.Millisecond,
			OrderBefore:    demo.Orders{Latency: demo.Latency{N: 200, P50: 56 * time.Millisecond, P99: 145 * time.Millisecond, Max: 155 * time.Millisecond}},
			OrderDuring:    demo.Orders{Latency: demo.Latency{N: 499, P50: 54 * time.Millisecond, P99: 139 * time.Millisecond, Max: 149 * time.Millisecond}},
			OrderAfter:     demo.Orders{Latency: demo.Latency{N: 738, P50: 58 * time.Millisecond, P99: 220 * time.Millisecond, Max: 364 * time.Millisecond}},
			OrdersEnqueued: 1437, OrdersCompleted: 1437,
			StartLimit: 4, Lowest: 1, EndLimit: 4, FellAfter: 8800 * time.Millisecond, BackAfter: 11700 * time.Millisecond,
			Changes: []demo.LimitChange{
				{At: 8800 * time.Millisecond, From: 4, To: 2, Reason: "jobs took 9384ms against a baseline of 3370ms"},
				{At: 13900 * time.Millisecond, From: 2, To: 1, Reason: "jobs took 12907ms against a baseline of 3404ms"},
				{At: 24200 * time.Millisecond, From: 3, To: 4, Reason: "jobs took 3285ms, within 1.5x their baseline of 3315ms, and the pool was full"},
			},
			Starts: 21, MostAtOnce: 4, ReportsTotal: 21, ReportsDone: 21,
		},
		Tiers:        []string{"regulatory", "close", "adhoc"},
		OrderTimeout: 2 * time.Second,
	}
}

func TestSummaryPrintsBeforeAndAfterSideBySide(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	summary().Print(&out)
	for _, want := range []string{
		"  regulatory     2 reports, started from 900ms to 3.9s into the month-end\n",
		"  adhoc          1 reports, started from 22s to 22s into the month-end\n",
		"the same load                            BEFORE                         AFTER\n",
		"                                         one shared pool of 20          walls: order 8, batch 4\n",
		"orders enqueued before the month-end\n" +
			"  orders                                 120                            119\n" +
			"  latency p50 / p99 / max                50ms / 130ms / 150ms           60ms / 140ms / 160ms\n" +
			"  timed out (> 2s) / errors              0 / 0                          0 / 0\n" +
			"orders enqueued during the month-end\n" +
			"  orders                                 400                            1300\n" +
			"  latency p50 / p99 / max                900ms / 5.9s / 6s              65ms / 260ms / 700ms\n" +
			"  timed out (> 2s) / errors              150 / 2                        0 / 0\n" +
			"order p99 during / before the month-end  45.4x                          1.9x\n" +
			"reports done                             40/40 in 9s                    40/40 in 33s\n" +
			"most jobs / db connections at once, of size\n" +
			"  all jobs                               20 / - of 20                   -\n" +
			"  order                                  4 / 4 of 20                    6 / 6 of 8  held\n" +
			"  batch                                  20 / 20 of 20                  4 / 4 of 4  held\n",
		"BEFORE: the outage reproduced: order p99 during the month-end was 45.4x its p99 before (threshold 5x) and 150 orders enqueued during it timed out (threshold 1; an order times out after 2s).\n",
		"AFTER: the walls held: 40/40 reports completed, no pool went past its size, no tier was overtaken; 0 orders enqueued during the month-end timed out.\n",
		"SLOWDOWN: the report database slows      before the slowdown      during it (12.5s)        after the recovery\n" +
			"                                         5x slower for 12.5s; pool batch adaptive (min 1, max 4, every 1s, tolerance 1.5x)\n" +
			"orders enqueued\n" +
			"  orders                                 200                      499                      738\n" +
			"  latency p50 / p99 / max                56ms / 145ms / 155ms     54ms / 139ms / 149ms     58ms / 220ms / 364ms\n" +
			"  timed out (> 2s) / errors              0 / 0                    0 / 0                    0 / 0\n" +
			"orders in the act                        1437 enqueued, 1437 completed: none lost\n" +
			"the batch pool's limit                   4 at the start, lowest 1, 4 at the end\n" +
			"  fell below 4                           8.8s after the database slowed\n" +
			"  back at 4                              11.7s after the database recovered\n" +
			"  batch jobs, counted inside             most 4 of 4 at once; 0 of 21 starts beyond the limit\n" +
			"reports done                             21/21 in 36.5s\n",
		"SLOWDOWN: the adaptive limit followed the database: with the report database 5x slower, the batch pool's limit fell below 4 8.8s after (lowest 1) and was back at 4 11.7s after it recovered; no job started beyond the limit; all 1437 orders completed (order p99 145ms before the slowdown, 139ms during it, 220ms after) and 21/21 reports.\n",
	} {
		require.Contains(t, out.String(), want)
	}
	require.NotContains(t, out.String(), "close ", "a tier without reports is left out")
}

func TestSummaryOK(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(s *demo.Summary)
		ok     bool
	}{
		{"the outage reproduced and the walls held", func(*demo.Summary) {}, true},
		{"BEFORE skipped: the walls decide", func(s *demo.Summary) { s.Outage = nil }, true},
		{"only timeouts show the outage", func(s *demo.Summary) { s.Outage.OrderDuring.P99 = 200 * time.Millisecond }, true},
		{"only the p99 shows the outage", func(s *demo.Summary) { s.Outage.OrderDuring.TimedOut = 0 }, true},
		{"the outage did not reproduce", func(s *demo.Summary) {
			s.Outage.OrderDuring = demo.Orders{Latency: demo.Latency{N: 400, P50: 60 * time.Millisecond, P99: 640 * time.Millisecond}}
		}, false},
		{"no orders during the month-end", func(s *demo.Summary) { s.Outage.OrderDuring = demo.Orders{} }, false},
		{"a tier overtaken", func(s *demo.Summary) { s.Inversions = 1 }, false},
		{"a pool over its size", func(s *demo.Summary) { s.Walls.Pools[1].MaxConcurrent = 5 }, false},
		{"more connections than the size", func(s *demo.Summary) { s.Walls.Pools[1].MaxConns = 5 }, false},
		{"a report failed", func(s *demo.Summary) { s.Walls.ReportsDone, s.Walls.ReportsFailed = 39, 1 }, false},
		{"a report never finished", func(s *demo.Summary) { s.Walls.ReportsDone = 39 }, false},
		{"the third act skipped", func(s *demo.Summary) { s.Slowdown = nil }, true},
		{"the limit did not fall", func(s *demo.Summary) { s.Slowdown.FellAfter = -1 }, false},
		{"the limit fell before the slowdown", func(s *demo.Summary) { s.Slowdown.FellBeforeSlowdown = true }, false},
		{"the limit was not back", func(s *demo.Summary) { s.Slowdown.BackAfter = -1 }, false},
		{"a job started beyond the limit", func(s *demo.Summary) { s.Slowdown.OverLimit = 1 }, false},
		{"an order lost in the act", func(s *demo.Summary) { s.Slowdown.OrdersCompleted-- }, false},
		{"an order of the act timed out", func(s *demo.Summary) { s.Slowdown.OrdersCompleted--; s.Slowdown.OrderAfter.TimedOut++ }, true},
		{"a report of the act failed", func(s *demo.Summary) { s.Slowdown.ReportsDone, s.Slowdown.ReportsFailed = 20, 1 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := summary()
			tc.change(&s)
			require.Equal(t, tc.ok, s.OK())
		})
	}
}

func TestVerdictSaysWhenTheOutageDidNotReproduce(t *testing.T) {
	t.Parallel()
	s := summary()
	s.Outage.OrderDuring = demo.Orders{Latency: demo.Latency{N: 400, P50: 60 * time.Millisecond, P99: 260 * time.Millisecond}}
	s.Walls.Pools[1].MaxConcurrent = 5
	s.Slowdown.FellAfter, s.Slowdown.BackAfter, s.Slowdown.EndLimit, s.Slowdown.OrdersCompleted = -1, -1, 2, 1436
	require.Equal(t, []string{
		"BEFORE: the outage did NOT reproduce: order p99 during the month-end was 2.0x its p99 before (threshold 5x) and 0 orders enqueued during it timed out (threshold 1; an order times out after 2s). Without it this run shows nothing about the walls; try again on a quieter machine, or with more -orders-per-sec.",
		"AFTER: the walls did NOT hold: pool batch went past its size 4 (5 jobs, 4 connections at once).",
		"SLOWDOWN: the adaptive limit did NOT do its part: the limit did not fall below 4 while the database was 5x slower for 12.5s; the limit was not back at 4 after the database recovered (it ended at 2); 1 of 1437 orders failed or never ended; order p99 145ms before the slowdown, 139ms during it, 220ms after.",
	}, s.Verdict())

	// Orders that waited past the order timeout: counted and shown, not
	// held against the act; an order that failed is.
	s = summary()
	s.Slowdown.OrdersCompleted -= 2
	s.Slowdown.OrderDuring.TimedOut = 2
	require.True(t, s.OK())
	var table bytes.Buffer
	s.Print(&table)
	require.Contains(t, table.String(), "orders in the act                        1437 enqueued, 1435 completed: 2 timed out\n")
	require.Equal(t, "SLOWDOWN: the adaptive limit followed the database: with the report database 5x slower, the batch pool's limit fell below 4 8.8s after (lowest 1) and was back at 4 11.7s after it recovered; no job started beyond the limit; 1435 of 1437 orders completed and 2 waited past the 2s order timeout (order p99 145ms before the slowdown, 139ms during it, 220ms after; a machine busy with other work alone can make an order that late) and 21/21 reports.", s.Verdict()[2])
	s.Slowdown.OrdersCompleted--
	s.Slowdown.FellAfter = -1
	require.False(t, s.OK())
	table.Reset()
	s.Print(&table)
	require.Contains(t, table.String(), "1437 enqueued, 1434 completed: 2 timed out, 1 FAILED\n")
	require.Equal(t, "SLOWDOWN: the adaptive limit did NOT do its part: the limit did not fall below 4 while the database was 5x slower for 12.5s; 1 of 1437 orders failed or never ended; order p99 145ms before the slowdown, 139ms during it, 220ms after; 2 orders waited past the 2s order timeout.", s.Verdict()[2])

	s = summary()
	s.Outage.OrderDuring = demo.Orders{Latency: demo.Latency{N: 400, P50: 60 * time.Millisecond, P99: 260 * time.Millisecond}}
	s.Outage.ReportsTotal = 10
	require.Equal(t, "BEFORE: the outage did NOT reproduce: order p99 during the month-end was 2.0x its p99 before (threshold 5x) and 0 orders enqueued during it timed out (threshold 1; an order times out after 2s). The month-end has 10 reports, fewer than the shared pool's 20 slots, so they never took them all: run it for more months (-periods).",
		s.Verdict()[0])
}

// dashboardSeen is what watchDashboard saw of the demo's page.
type dashboardSeen struct {
	before, after             bool
	sharedMax, connectionsMax float64
	beforeSpan                time.Duration // from the first to the last BEFORE sample on the timeline
	bothOnTimeline            bool
}

type dashboardWatch struct {
	stop func() dashboardSeen
}

// watchDashboard waits for the demo to print its dashboard's URL in out,
// then reads its scene (/live's numbers through /api/history's samples)
// until stop.
func watchDashboard(t *testing.T, out *apptest.SyncBuffer) dashboardWatch {
	t.Helper()
	done := make(chan struct{})
	result := make(chan dashboardSeen, 1)
	go func() {
		var seen dashboardSeen
		defer func() { result <- seen }()
		re := regexp.MustCompile(`dashboard: (http://\S+/) `)
		var base string
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			if base == "" {
				if m := re.FindStringSubmatch(out.String()); m != nil {
					base = m[1]
				}
				continue
			}
			resp, err := http.Get(base + "api/history")
			if err != nil {
				continue // the listener stops at the end of the run
			}
			var h struct {
				Samples []web.Sample `json:"samples"`
			}
			err = json.NewDecoder(resp.Body).Decode(&h)
			resp.Body.Close()
			if err != nil {
				continue
			}
			var first, last int64
			phases := map[string]bool{}
			for _, s := range h.Samples {
				switch {
				case strings.HasPrefix(s.Phase, "BEFORE"):
					seen.before = true
					phases["BEFORE"] = true
					seen.sharedMax = max(seen.sharedMax, s.Gauges["shared_running"])
					seen.connectionsMax = max(seen.connectionsMax, s.Gauges["connections"])
					if first == 0 {
						first = s.At
					}
					last = s.At
				case strings.HasPrefix(s.Phase, "AFTER"):
					seen.after = true
					phases["AFTER"] = true
				}
			}
			if first > 0 {
				seen.beforeSpan = max(seen.beforeSpan, time.Duration(last-first)*time.Millisecond)
			}
			seen.bothOnTimeline = seen.bothOnTimeline || len(phases) == 2
		}
	}()
	return dashboardWatch{stop: func() dashboardSeen {
		close(done)
		return <-result
	}}
}

func TestSlowdownTimeline(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{
		"[SLOWDOWN] the batch pool's limit (from its log in Redis; times from the slowdown):",
		"       +0s  the report database: 5x slower",
		"     +8.8s  4 -> 2  jobs took 9384ms against a baseline of 3370ms",
		"    +12.5s  the report database: healthy again",
		"    +13.9s  2 -> 1  jobs took 12907ms against a baseline of 3404ms",
		"    +24.2s  3 -> 4  jobs took 3285ms, within 1.5x their baseline of 3315ms, and the pool was full",
	}, summary().Slowdown.Timeline("SLOWDOWN"))
}
