package app_test

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lci-labs/compartment/internal/testwait"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/database"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/internal/testdb"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/queues"
)

func testConfig(t *testing.T, r *testredis.Redis, extra string) string {
	return apptest.Config(t, r, extra)
}

func TestShippedConfigs(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"worker.yaml", "worker-postgres.yaml", "demo.yaml"} {
		t.Run(name, func(t *testing.T) {
			cfg, err := app.Load(apptest.RepoPath("configs/"+name), nil)
			require.NoError(t, err)
			require.Len(t, cfg.Pools, 3)
			require.Equal(t, 20, cfg.Database.MaxConnections)
			need, have, over := cfg.Overbooked()
			require.Equal(t, 20, need)
			require.Equal(t, 20, have)
			require.False(t, over)
			require.Equal(t, []string{"regulatory", "close", "management", "adhoc"}, cfg.Policy.Tiers())
			for _, s := range cfg.Schedules {
				require.True(t, s.Disabled, "schedule %q ships off: a worker started from a shipped file enqueues nothing by itself", s.Name)
			}
		})
	}
}

// TestShippedDatabases: the shipped worker.yaml, read with no environment,
// uses the embedded SQLite: a user with only Redis can follow the
// walk-through (docs/WALKTHROUGH.md), and no database the user did not
// name gets tables or demo data.
// PostgreSQL is named by worker-postgres.yaml (or DATABASE_URL), which is
// worker.yaml but for its database section.
func TestShippedDatabases(t *testing.T) {
	t.Parallel()
	load := func(t *testing.T, name string, env map[string]string) *app.Config {
		t.Helper()
		cfg, err := app.Load(apptest.RepoPath("configs/"+name), func(k string) string { return env[k] })
		require.NoError(t, err)
		return cfg
	}
	t.Run("worker.yaml: embedded SQLite", func(t *testing.T) {
		cfg := load(t, "worker.yaml", nil)
		require.Empty(t, cfg.Database.URL)
		require.Equal(t, database.DefaultSQLitePath, cfg.Database.SQLitePath)
		require.Equal(t, "SQLite out/compartment.db", cfg.Database.Describe())
	})
	t.Run("worker-postgres.yaml: PostgreSQL", func(t *testing.T) {
		cfg := load(t, "worker-postgres.yaml", nil)
		require.Empty(t, cfg.Database.SQLitePath)
		require.Equal(t, "PostgreSQL postgres://postgres@127.0.0.1:5432/compartment?sslmode=disable", cfg.Database.Describe())
	})
	t.Run("worker.yaml with DATABASE_URL: PostgreSQL", func(t *testing.T) {
		cfg := load(t, "worker.yaml", map[string]string{"DATABASE_URL": "postgres://app@db.internal/app"})
		require.True(t, cfg.DatabaseURLFromEnv)
		require.Equal(t, "PostgreSQL postgres://app@db.internal/app", cfg.Database.Describe())
	})
	t.Run("the two differ only in their database", func(t *testing.T) {
		read := func(name string) map[string]any {
			data, err := os.ReadFile(apptest.RepoPath("configs/" + name))
			require.NoError(t, err)
			var m map[string]any
			require.NoError(t, yaml.Unmarshal(data, &m))
			delete(m, "database")
			return m
		}
		require.Equal(t, read("worker.yaml"), read("worker-postgres.yaml"), "change both files together")
	})
}

// TestConfigSummaries: what the commands' -h says the default config
// points at is what configs/worker.yaml, read with no environment, uses;
// the other shipped files are summed up in the same words.
func TestConfigSummaries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ file, want string }{
		{app.DefaultConfigPath, app.DefaultConfigSummary},
		{"configs/worker.yaml", "a real Redis at 127.0.0.1:6379 DB 1, embedded SQLite out/compartment.db"},
		{"configs/worker-postgres.yaml", "a real Redis at 127.0.0.1:6379 DB 1, PostgreSQL postgres://postgres@127.0.0.1:5432/compartment?sslmode=disable"},
		{"configs/demo.yaml", "an embedded in-memory Redis at 127.0.0.1:16379, embedded SQLite out/demo.db"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			cfg, err := app.Load(apptest.RepoPath(tc.file), nil)
			require.NoError(t, err)
			require.Equal(t, tc.want, cfg.Summary())
		})
	}
}

func TestAppConfigMistakes(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cases := []struct {
		name, replace, with string
		want                []string
	}{
		{"overbooked connections", "max_connections: 10", "max_connections: 6",
			[]string{"pools need 7 database connections (order 3 + search 2 + batch 2) but database.max_connections is 6: raise max_connections, shrink the pools, or set database.allow_overbooking: true"}},
		{"missing catalog", "reports: " + apptest.RepoPath("configs/reports.yaml"), "reports: /nonexistent/reports.yaml",
			[]string{"report catalog: open /nonexistent/reports.yaml: no such file or directory"}},
		{"unknown database key", "max_connections: 10", "max_connections: 10\n  pool_size: 3", []string{"unknown key database.pool_size (the keys here are url, sqlite_path, max_connections"}},
		{"reports pool without tiers", "    tiers: [regulatory, close, management, adhoc]\n", "", []string{`pool "batch": runs reports, so it needs tiers`}},
		{"bad database url", "  sqlite_path:", "  url: mysql://x\n  sqlite_path:", []string{`database: url "mysql://x" must be a postgres:// URL`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := testConfig(t, r, "")
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			if tc.name == "bad database url" && testdb.Postgres() {
				t.Skip("the test database is PostgreSQL already")
			}
			body := strings.Replace(string(data), tc.replace, tc.with, 1)
			require.NotEqual(t, string(data), body, "the case must change the config")
			require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
			_, err = app.Load(path, nil)
			var ce *queues.ConfigError
			require.ErrorAs(t, err, &ce)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}

	t.Run("overbooking allowed", func(t *testing.T) {
		path := testConfig(t, r, "")
		data, _ := os.ReadFile(path)
		body := strings.Replace(string(data), "max_connections: 10", "max_connections: 6\n  allow_overbooking: true", 1)
		require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
		cfg, err := app.Load(path, nil)
		require.NoError(t, err)
		need, have, over := cfg.Overbooked()
		require.Equal(t, []any{7, 6, true}, []any{need, have, over})
	})

	t.Run("DATABASE_URL overrides", func(t *testing.T) {
		env := map[string]string{"DATABASE_URL": "postgres://u:pw@db.internal:5432/app"}
		cfg, err := app.Load(testConfig(t, r, ""), func(k string) string { return env[k] })
		require.NoError(t, err)
		require.True(t, cfg.DatabaseURLFromEnv)
		require.Equal(t, "postgres://u:pw@db.internal:5432/app", cfg.Database.URL)
		require.Empty(t, cfg.Database.SQLitePath)
		require.Equal(t, "PostgreSQL postgres://u:xxxxx@db.internal:5432/app", cfg.Database.Describe())
	})
}

// orderRow is one row of the orders table, read back for independent sums.
type orderRow struct {
	at, region, category, status string
	amount                       int64
}

func readOrders(t *testing.T, db *database.DB) []orderRow {
	rows, err := db.SQL().Query(`SELECT ordered_at, region, category, status, amount_cents FROM orders`)
	require.NoError(t, err)
	defer rows.Close()
	var out []orderRow
	for rows.Next() {
		var r orderRow
		require.NoError(t, rows.Scan(&r.at, &r.region, &r.category, &r.status, &r.amount))
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

func readCSV(t *testing.T, path string) [][]string {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	return recs
}

// TestMonthEndEndToEnd runs a month-end plan through the worker on the test
// database and checks the report files against sums the test computes itself
// from the raw orders.
func TestMonthEndEndToEnd(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg, err := app.Load(testConfig(t, r, ""), nil)
	require.NoError(t, err)

	var mu sync.Mutex
	var doneOrder []string
	w, err := app.NewWorker(context.Background(), cfg, app.WorkerOptions{
		Logger: slog.New(slog.DiscardHandler),
		OnReportDone: func(p handlers.ReportPayload, _ reports.Result) {
			mu.Lock()
			doneOrder = append(doneOrder, p.Report)
			mu.Unlock()
		},
	})
	require.NoError(t, err)
	t.Cleanup(w.Close)
	enq, err := app.NewEnqueuerFor(cfg, w.Redis)
	require.NoError(t, err)
	t.Cleanup(enq.Close)
	ctx := context.Background()

	planFile := filepath.Join(t.TempDir(), "plan.yaml")
	require.NoError(t, os.WriteFile(planFile, []byte("reports:\n  - name: vat-return\n  - name: trial-balance\n  - name: revenue-by-category\n    tier: regulatory\n  - name: refunds-analysis\n"), 0o600))
	plan, err := reports.LoadPlan(planFile, "2026-10", cfg.Catalog, cfg.Policy)
	require.NoError(t, err)
	res, err := enq.EnqueuePlan(ctx, plan)
	require.NoError(t, err)
	require.Equal(t, []queues.EnqueueOutcome{queues.Enqueued, queues.Enqueued, queues.Enqueued, queues.Enqueued}, res.Outcomes)
	require.Equal(t, "regulatory", res.Jobs[2].Tier, "the plan's tier overrides the mapping")

	require.NoError(t, w.Start(ctx))
	testwait.For(t, 60*time.Second, "the month-end plan to finish", func() bool {
		states, err := enq.Progress(ctx, res.Jobs)
		require.NoError(t, err)
		for _, c := range app.CountByTier(states, cfg.Policy.Tiers()) {
			if !c.Finished() {
				return false
			}
			require.Zero(t, c.Failed)
		}
		return true
	})

	orders := readOrders(t, w.DB)
	inPeriod := func(o orderRow) bool { return o.at >= "2026-10-01T00:00:00Z" && o.at < "2026-11-01T00:00:00Z" }

	// vat-return: per region, completed sales, refunds and their difference.
	type vat struct{ sales, refunds int64 }
	wantVAT := map[string]*vat{}
	for _, o := range orders {
		if !inPeriod(o) {
			continue
		}
		v := wantVAT[o.region]
		if v == nil {
			v = &vat{}
			wantVAT[o.region] = v
		}
		switch o.status {
		case database.StatusCompleted:
			v.sales += o.amount
		case database.StatusRefunded:
			v.refunds += o.amount
		}
	}
	got := readCSV(t, filepath.Join(cfg.OutputDir, "vat-return_2026-10.csv"))
	require.Equal(t, []string{"region", "sales_cents", "refunds_cents", "vat_base_cents"}, got[0])
	require.Len(t, got, len(wantVAT)+1)
	for _, row := range got[1:] {
		v := wantVAT[row[0]]
		require.NotNil(t, v, row[0])
		require.Equal(t, []string{row[0], itoa(v.sales), itoa(v.refunds), itoa(v.sales - v.refunds)}, row)
	}

	// trial-balance: per status, count and amount.
	type tb struct{ n, amount int64 }
	wantTB := map[string]*tb{}
	for _, o := range orders {
		if inPeriod(o) {
			x := wantTB[o.status]
			if x == nil {
				x = &tb{}
				wantTB[o.status] = x
			}
			x.n++
			x.amount += o.amount
		}
	}
	got = readCSV(t, filepath.Join(cfg.OutputDir, "trial-balance_2026-10.csv"))
	statuses := make([]string, 0, len(wantTB))
	for s := range wantTB {
		statuses = append(statuses, s)
	}
	sort.Strings(statuses)
	want := [][]string{{"status", "orders", "amount_cents"}}
	for _, s := range statuses {
		want = append(want, []string{s, itoa(wantTB[s].n), itoa(wantTB[s].amount)})
	}
	require.Equal(t, want, got)

	// A rerun after completion replaces the job and writes the same bytes.
	before, err := os.ReadFile(filepath.Join(cfg.OutputDir, "vat-return_2026-10.csv"))
	require.NoError(t, err)
	job, outcome, err := enq.EnqueueReport(ctx, "vat-return", "2026-10", "")
	require.NoError(t, err)
	require.Equal(t, queues.Replaced, outcome)
	testwait.For(t, 30*time.Second, "the rerun", func() bool {
		st, err := enq.Progress(ctx, []app.ReportJob{job})
		require.NoError(t, err)
		return st[0].State == "completed"
	})
	after, err := os.ReadFile(filepath.Join(cfg.OutputDir, "vat-return_2026-10.csv"))
	require.NoError(t, err)
	require.Equal(t, before, after)
	entries, err := os.ReadDir(cfg.OutputDir)
	require.NoError(t, err)
	for _, e := range entries {
		require.Falsef(t, strings.HasPrefix(e.Name(), "."), "temporary file left behind: %s", e.Name())
	}

	// The batch pool never held more connections than its size.
	require.LessOrEqual(t, w.DB.PeakConnections()["batch"], 2)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// newEnqueuer returns a config and an enqueuer on a test Redis, with no
// worker running.
func newEnqueuer(t *testing.T) (*app.Config, *app.Enqueuer) {
	t.Helper()
	r := testredis.New(t)
	cfg, err := app.Load(testConfig(t, r, ""), nil)
	require.NoError(t, err)
	enq, err := app.NewEnqueuerFor(cfg, &app.Redis{Client: r.Client, Addr: r.Options.Addr})
	require.NoError(t, err)
	t.Cleanup(enq.Close)
	return cfg, enq
}

func TestEnqueueReportRules(t *testing.T) {
	t.Parallel()
	cfg, enq := newEnqueuer(t)
	ctx := context.Background()

	job, outcome, err := enq.EnqueueReport(ctx, "top-customers", "2026-10", "")
	require.NoError(t, err)
	require.Equal(t, queues.Enqueued, outcome)
	require.Equal(t, "management", job.Tier, "the priorities mapping")
	require.Equal(t, cfg.Namespace+":batch:management", job.Queue)

	_, outcome, err = enq.EnqueueReport(ctx, "top-customers", "2026-10", "")
	require.NoError(t, err)
	require.Equal(t, queues.Duplicate, outcome, "the same report and period is not enqueued twice")
	_, outcome, err = enq.EnqueueReport(ctx, "top-customers", "2026-10", "regulatory")
	require.NoError(t, err)
	require.Equal(t, queues.Duplicate, outcome)

	// Concurrent enqueues of one report and period, at different tiers:
	// exactly one job results.
	var wg sync.WaitGroup
	outcomes := make([]queues.EnqueueOutcome, 12)
	tiers := cfg.Policy.Tiers()
	for i := range outcomes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, o, err := enq.EnqueueReport(ctx, "ar-aging", "2026-08", tiers[i%len(tiers)])
			require.NoError(t, err)
			outcomes[i] = o
		}()
	}
	wg.Wait()
	enqueued := 0
	for _, o := range outcomes {
		if o == queues.Enqueued {
			enqueued++
		}
	}
	require.Equal(t, 1, enqueued, "outcomes: %v", outcomes)

	job, _, err = enq.EnqueueReport(ctx, "top-customers", "2026-09", "regulatory")
	require.NoError(t, err)
	require.Equal(t, "regulatory", job.Tier, "an explicit tier wins")

	job, _, err = enq.EnqueueReport(ctx, "customer-cohorts", "2026-10", "")
	require.NoError(t, err)
	require.Equal(t, "adhoc", job.Tier, "an unmapped report gets the default tier")

	_, _, err = enq.EnqueueReport(ctx, "payroll", "2026-10", "")
	require.ErrorContains(t, err, `unknown report "payroll" (catalog: vat-return, `)
	_, _, err = enq.EnqueueReport(ctx, "vat-return", "2026-13", "")
	require.ErrorContains(t, err, `period "2026-13" must be a month written YYYY-MM`)
	_, _, err = enq.EnqueueReport(ctx, "vat-return", "2026-10", "urgent")
	require.ErrorContains(t, err, `priority: unknown tier "urgent"`)

	var st app.Status
	testwait.For(t, 10*time.Second, "the oldest pending job to show an age", func() bool {
		st, err = enq.Status(ctx)
		require.NoError(t, err)
		return st.Pools[2].Queues[2].OldestPendingSeconds > 0 // management
	})
	require.Len(t, st.Pools, 3)
	batch := st.Pools[2]
	require.Equal(t, "batch", batch.Name)
	require.Zero(t, batch.Workers)
	byTier := map[string]app.QueueStatus{}
	for _, q := range batch.Queues {
		byTier[q.Tier] = q
	}
	// top-customers 2026-10 (management), ar-aging 2026-08 once (in
	// whichever tier won), top-customers 2026-09 (regulatory) and
	// customer-cohorts (adhoc).
	total := 0
	for _, q := range batch.Queues {
		total += q.Pending
	}
	require.Equal(t, 4, total)
	require.GreaterOrEqual(t, byTier["management"].Pending, 1)
	require.GreaterOrEqual(t, byTier["regulatory"].Pending, 1)
	require.GreaterOrEqual(t, byTier["adhoc"].Pending, 1)
}

// TestUnwritableOutputDirRetries: a report that cannot write its file fails
// with the reason and is retried later, not lost.
func TestUnwritableOutputDirRetries(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	path := testConfig(t, r, "")
	blocker := filepath.Join(t.TempDir(), "not-a-dir")
	require.NoError(t, os.WriteFile(blocker, nil, 0o600))
	data, _ := os.ReadFile(path)
	body := strings.Replace(string(data), "output_dir: ", "output_dir: "+blocker+"/reports #", 1)
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	cfg, err := app.Load(path, nil)
	require.NoError(t, err)

	w, err := app.NewWorker(context.Background(), cfg, app.WorkerOptions{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(w.Close)
	enq, err := app.NewEnqueuerFor(cfg, w.Redis)
	require.NoError(t, err)
	t.Cleanup(enq.Close)
	job, _, err := enq.EnqueueReport(context.Background(), "vat-return", "2026-10", "")
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))

	var info *asynq.TaskInfo
	testwait.For(t, 30*time.Second, "the report to fail and wait for a retry", func() bool {
		info, err = enq.Insp.GetTaskInfo(job.Queue, job.ID)
		require.NoError(t, err)
		return info.State == asynq.TaskStateRetry
	})
	require.Contains(t, info.LastErr, `report "vat-return": output directory: mkdir `+blocker)
	require.Equal(t, 1, info.Retried)
}

// TestPlanOrderWithinTier: a plan's reports of one tier are queued, and so
// start, in plan order.
func TestPlanOrderWithinTier(t *testing.T) {
	t.Parallel()
	cfg, enq := newEnqueuer(t)

	names := cfg.Catalog.Names()
	var body strings.Builder
	body.WriteString("reports:\n")
	// Reverse catalog order, every report in one of two tiers.
	var wantClose, wantAdhoc []string
	for i := len(names) - 1; i >= 0; i-- {
		tier := "close"
		if i%2 == 0 {
			tier = "adhoc"
		}
		fmt.Fprintf(&body, "  - name: %s\n    tier: %s\n", names[i], tier)
		if tier == "close" {
			wantClose = append(wantClose, names[i])
		} else {
			wantAdhoc = append(wantAdhoc, names[i])
		}
	}
	planFile := filepath.Join(t.TempDir(), "plan.yaml")
	require.NoError(t, os.WriteFile(planFile, []byte(body.String()), 0o600))
	plan, err := reports.LoadPlan(planFile, "2026-10", cfg.Catalog, cfg.Policy)
	require.NoError(t, err)
	_, err = enq.EnqueuePlan(context.Background(), plan)
	require.NoError(t, err)

	pendingNames := func(tier string) []string {
		tasks, err := enq.Insp.ListPendingTasks(cfg.Engine.Namespace + ":batch:" + tier)
		require.NoError(t, err)
		var out []string
		for _, ti := range tasks {
			var p handlers.ReportPayload
			require.NoError(t, json.Unmarshal(ti.Payload, &p))
			out = append(out, p.Report)
		}
		return out
	}
	require.Equal(t, wantClose, pendingNames("close"))
	require.Equal(t, wantAdhoc, pendingNames("adhoc"))
}

// TestTierNotServedByPool: a report pool that does not serve a tier the
// priorities file gives a report is refused when the config is loaded, at
// worker start, not at the first enqueue of that report.
func TestTierNotServedByPool(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	path := testConfig(t, r, "")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	body := strings.Replace(string(data), "tiers: [regulatory, close, management, adhoc]", "tiers: [regulatory, adhoc]", 1)
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	_, err = app.Load(path, nil)
	var ce *queues.ConfigError
	require.ErrorAs(t, err, &ce)
	require.ErrorContains(t, err, `pool "batch": report "trial-balance" has tier "close" in the priorities file, which the pool does not serve (its tiers: ["regulatory" "adhoc"])`)
}

// TestWorkerStartRemovesStaleTempFiles: a worker killed mid-report leaves a
// temporary file that only a later run of the same report and period
// removes. At start the worker removes those older than any run could be,
// and leaves a recent one (a run of another worker may still write it) and
// every report file alone.
func TestWorkerStartRemovesStaleTempFiles(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg, err := app.Load(testConfig(t, r, ""), nil)
	require.NoError(t, err)
	dir := cfg.OutputDir
	require.NoError(t, os.MkdirAll(dir, 0o755))
	files := map[string]time.Duration{
		".vat-return_2026-09.csv.tmp-123":    7 * 24 * time.Hour, // stale: removed
		".trial-balance_2026-10.csv.tmp-456": time.Minute,        // may be in progress: kept
		"vat-return_2026-08.csv":             30 * 24 * time.Hour,
		".notes.tmp-1":                       30 * 24 * time.Hour, // not a report's temporary file
	}
	for name, age := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte("x"), 0o600))
		at := time.Now().Add(-age)
		require.NoError(t, os.Chtimes(p, at, at))
	}
	w, err := app.NewWorker(context.Background(), cfg, app.WorkerOptions{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(w.Close)
	require.NoError(t, w.Start(context.Background()))
	for name := range files {
		_, err := os.Stat(filepath.Join(dir, name))
		if name == ".vat-return_2026-09.csv.tmp-123" {
			require.ErrorIs(t, err, os.ErrNotExist, "the stale temporary file is removed")
		} else {
			require.NoError(t, err, "%s is kept", name)
		}
	}
}

// A job the watch stops reading (JobState.Ended) is one its tier's count
// takes as finished, state by state.
func TestJobEndedAgreesWithTierFinished(t *testing.T) {
	ended := map[string]bool{"completed": true, "archived": true, "missing": true}
	for _, st := range []string{"pending", "active", "scheduled", "retry", "completed", "archived", "missing"} {
		s := app.JobState{Job: app.ReportJob{Tier: "critical"}, State: st}
		counts := app.CountByTier([]app.JobState{s}, []string{"critical"})
		require.Len(t, counts, 1)
		require.Equal(t, ended[st], s.Ended(), st)
		require.Equal(t, s.Ended(), counts[0].Finished(), st)
	}
}
