package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
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
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

func noEnv(string) string { return "" }

// orderPayload is a valid order:create payload (handlers' example).
const orderPayload = `{"region":"north","category":"books","customer_id":7,"amount_cents":1299}`

func enqueue(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), cli.Env{Args: args, Stdout: &out, Stderr: &errOut, Getenv: noEnv})
	return code, out.String(), errOut.String()
}

func status(t *testing.T, config string) app.Status {
	t.Helper()
	code, out, stderr := enqueue(t, "-config", config, "status", "-json")
	require.Equal(t, 0, code, stderr)
	var st app.Status
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	return st
}

func pendingReports(st app.Status) int {
	n := 0
	for _, q := range st.Pools[2].Queues {
		n += q.Pending
	}
	return n
}

func writePlan(t *testing.T, body string) string {
	p := filepath.Join(t.TempDir(), "plan.yaml")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no command", []string{"-config", cfg}, "enqueue: missing command"},
		{"unknown command", []string{"-config", cfg, "purge"}, `enqueue: unknown command "purge"`},
		{"bad global flag", []string{"-cfg", cfg}, "enqueue: flag provided but not defined: -cfg"},
		{"report without name", []string{"-config", cfg, "report", "-period", "2026-10"}, "enqueue report: -name and -period are required"},
		{"unknown report", []string{"-config", cfg, "report", "-name", "payroll", "-period", "2026-10"}, `enqueue report: unknown report "payroll" (catalog: vat-return,`},
		{"bad period", []string{"-config", cfg, "report", "-name", "vat-return", "-period", "2026-13"}, `enqueue report: period "2026-13" must be a month written YYYY-MM, like 2026-10`},
		{"unknown tier", []string{"-config", cfg, "report", "-name", "vat-return", "-period", "2026-10", "-tier", "urgent"}, `enqueue report: priority: unknown tier "urgent"`},
		{"report name with a path", []string{"-config", cfg, "report", "-name", "../../etc/passwd", "-period", "2026-10"}, `unknown report "../../etc/passwd"`},
		{"month-end without plan", []string{"-config", cfg, "month-end", "-period", "2026-10"}, "enqueue month-end: -plan and -period are required"},
		{"bad config", []string{"-config", "/nonexistent.yaml", "status"}, "enqueue status: config /nonexistent.yaml: 1 problem"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := enqueue(t, tc.args...)
			require.Equal(t, 2, code, stderr)
			require.Contains(t, stderr, tc.want)
		})
	}
	require.Zero(t, pendingReports(status(t, cfg)), "no usage error enqueued anything")
}

func TestInvalidPlanEnqueuesNothing(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	plan := writePlan(t, "reports:\n  - name: vat-return\n  - name: payroll\n  - name: trial-balance\n    tier: urgent\n  - name: vat-return\n")
	code, stdout, stderr := enqueue(t, "-config", cfg, "month-end", "-plan", plan, "-period", "2026-1")
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	for _, w := range []string{
		`period "2026-1" must be a month written YYYY-MM`,
		`reports[1] "payroll": unknown report`,
		`reports[2] "trial-balance": priority: unknown tier "urgent"`,
		`reports[3] "vat-return": listed twice (also reports[0])`,
		"nothing was enqueued",
	} {
		require.Contains(t, stderr, w)
	}
	require.Zero(t, pendingReports(status(t, cfg)))
}

func TestReportAndDuplicate(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	code, stdout, stderr := enqueue(t, "-config", cfg, "report", "-name", "vat-return", "-period", "2026-10")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "report vat-return for 2026-10: enqueued (tier regulatory, queue ")
	code, stdout, _ = enqueue(t, "-config", cfg, "report", "-name", "vat-return", "-period", "2026-10", "-tier", "adhoc")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "report vat-return for 2026-10: already queued or running (tier regulatory")
	require.Equal(t, 1, pendingReports(status(t, cfg)))

	// A plan whose reports are all queued already says so, not "enqueued".
	plan := writePlan(t, "reports:\n  - name: vat-return\n")
	code, stdout, stderr = enqueue(t, "-config", cfg, "month-end", "-plan", plan, "-period", "2026-10")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `^month-end plan of 1 report: 0 new reports enqueued, 1 already queued or running, left as they are \(in \S+, \d+ reports/s\)\n`, stdout)
	require.Equal(t, 1, pendingReports(status(t, cfg)))

	code, stdout, _ = enqueue(t, "-config", cfg, "status")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "POOL    SCOPE    SIZE  WORKERS  ACTIVE  WAITING FOR SLOT  AVAILABLE  FULL       SLOTS HELD BY")
	require.Contains(t, stdout, "batch   cluster  2     0        0       0                 2          no worker  -")
	require.Regexp(t, `:batch:regulatory\s+regulatory\s+1\s+0\s+0\s+0\s+0\s+0\s+0\s+\d+ms`, stdout)
}

func TestRedisUnreachableExits1(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	data, _ := os.ReadFile(cfg)
	require.NoError(t, os.WriteFile(cfg, []byte(strings.Replace(string(data), r.URL, "redis://127.0.0.1:1/4", 1)), 0o600))
	for _, args := range [][]string{
		{"status"},
		{"report", "-name", "vat-return", "-period", "2026-10"},
	} {
		code, _, stderr := enqueue(t, append([]string{"-config", cfg}, args...)...)
		require.Equal(t, 1, code)
		require.Contains(t, stderr, "redis at 127.0.0.1:1 is unreachable")
	}
}

// startWorker runs the worker for cfg in this process.
func startWorker(t *testing.T, cfgPath string) *app.Worker {
	t.Helper()
	cfg, err := app.Load(cfgPath, nil)
	require.NoError(t, err)
	w, err := app.NewWorker(context.Background(), cfg, app.WorkerOptions{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(w.Close)
	require.NoError(t, w.Start(context.Background()))
	return w
}

func TestMonthEndWait(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	startWorker(t, cfg)
	plan := writePlan(t, "reports:\n  - name: vat-return\n  - name: trial-balance\n  - name: top-customers\n  - name: customer-cohorts\n")
	code, stdout, stderr := enqueue(t, "-config", cfg, "month-end", "-plan", plan, "-period", "2026-10", "-wait", "-poll", "50ms")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `month-end plan of 4 reports: 4 new reports enqueued \(in \S+, \d+ reports/s\)`, stdout)
	require.Contains(t, stdout, "TIER        NEW  ALREADY QUEUED  RERUN\nregulatory  1    0               0\nclose       1    0               0\nmanagement  1    0               0\nadhoc       1    0               0\n")
	require.Contains(t, stdout, "progress: regulatory 1/1, close 1/1, management 1/1, adhoc 1/1")
	require.Contains(t, stdout, ": 4 completed, 0 failed\n")
}

func TestMonthEndWaitReportsFailures(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	blocker := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(blocker, nil, 0o600))
	cfg := apptest.Config(t, r, "")
	data, _ := os.ReadFile(cfg)
	body := strings.Replace(string(data), "output_dir: ", "output_dir: "+blocker+"/out #", 1)
	body = strings.Replace(body, "max_retry: 2", "max_retry: 0", 1)
	require.NoError(t, os.WriteFile(cfg, []byte(body), 0o600))
	startWorker(t, cfg)

	plan := writePlan(t, "reports:\n  - name: vat-return\n")
	code, stdout, _ := enqueue(t, "-config", cfg, "month-end", "-plan", plan, "-period", "2026-10", "-wait", "-poll", "50ms")
	require.Equal(t, 1, code)
	require.Contains(t, stdout, ": 0 completed, 1 failed\n")
	require.Contains(t, stdout, `  FAILED vat-return (2026-10, tier regulatory): failed more times than max_retry allows (1 failure, max_retry 0): report "vat-return": output directory: mkdir `+blocker)
}

// A month-end enqueued again with -wait while reports of its plan are
// still queued (the first command's watching was interrupted, say) watches
// those reports too, until they finish: this command's own run holds only
// what it enqueued.
func TestMonthEndWaitAgain(t *testing.T) {
	t.Parallel()
	three := "reports:\n  - name: vat-return\n  - name: trial-balance\n  - name: top-customers\n"
	// watchAgain runs month-end -wait with plan, enqueued before, and
	// returns once it shows its progress, which it must not end on while
	// no worker runs.
	watchAgain := func(t *testing.T, path, plan string) (stdout, errOut *apptest.SyncBuffer, done chan int) {
		stdout, errOut, done = &apptest.SyncBuffer{}, &apptest.SyncBuffer{}, make(chan int, 1)
		go func() {
			done <- run(context.Background(), cli.Env{Args: []string{"-config", path, "month-end", "-plan", plan, "-period", "2026-10", "-wait", "-poll", "20ms"},
				Stdout: stdout, Stderr: errOut, Getenv: noEnv})
		}()
		testwait.For(t, 10*time.Second, "the progress to show", func() bool { return strings.Contains(stdout.String(), "progress: ") })
		select {
		case code := <-done:
			t.Fatalf("month-end -wait ended (exit %d) with its reports still queued:\n%s", code, stdout.String())
		default:
		}
		return stdout, errOut, done
	}
	// waitAgain enqueues first without -wait, then again with -wait while no
	// worker runs; once that shows its progress, a worker starts. cfg
	// edits the config first.
	waitAgain := func(t *testing.T, first, again string, cfg func(string) string) (string, int, string) {
		r := testredis.New(t)
		path := apptest.Config(t, r, "")
		if cfg != nil {
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(path, []byte(cfg(string(data))), 0o600))
		}
		code, _, stderr := enqueue(t, "-config", path, "month-end", "-plan", writePlan(t, first), "-period", "2026-10")
		require.Equal(t, 0, code, stderr)
		stdout, errOut, done := watchAgain(t, path, writePlan(t, again))
		startWorker(t, path)
		select {
		case code := <-done:
			return path, code, stdout.String() + errOut.String()
		case <-time.After(20 * time.Second):
			t.Fatalf("month-end -wait did not end once its reports could run:\n%s", stdout.String())
		}
		return "", 0, ""
	}

	t.Run("every report already queued", func(t *testing.T) {
		t.Parallel()
		cfg, code, out := waitAgain(t, three, three, nil)
		require.Equal(t, 0, code, out)
		require.Contains(t, out, "0 new reports enqueued, 3 already queued or running, left as they are")
		require.Contains(t, out, "3 reports already queued or running before this command: watching them too\nprogress: regulatory 0/1, close 0/1, management 0/1 (elapsed ")
		require.Contains(t, out, "progress: regulatory 1/1, close 1/1, management 1/1")
		require.True(t, strings.HasSuffix(out, "\nthe 3 reports queued before: 3 completed, 0 failed\n"), out)
		require.NotContains(t, out, "month-end finished", "its own run holds none of them")

		// Its own run is empty, and run wait says so as before.
		id := regexp.MustCompile(`run (month-end-\S+) \(`).FindStringSubmatch(out)
		require.NotNil(t, id, out)
		code, out, stderr := enqueue(t, "-config", cfg, "run", "wait", id[1])
		require.Equal(t, 0, code, stderr)
		require.Contains(t, out, "month-end finished in ")
		require.Contains(t, out, ": 0 completed, 0 failed\n")
	})
	t.Run("some already queued", func(t *testing.T) {
		t.Parallel()
		_, code, out := waitAgain(t, three, three+"  - name: customer-cohorts\n", nil)
		require.Equal(t, 0, code, out)
		require.Contains(t, out, "1 new report enqueued, 3 already queued or running, left as they are")
		require.Contains(t, out, "progress: regulatory 0/1, close 0/1, management 0/1, adhoc 0/1 (elapsed ")
		require.Contains(t, out, "progress: regulatory 1/1, close 1/1, management 1/1, adhoc 1/1")
		require.Regexp(t, `\nmonth-end finished in \S+: 1 completed, 0 failed\nthe 3 reports queued before: 3 completed, 0 failed\n$`, out)
	})
	t.Run("the earlier run cancelled", func(t *testing.T) {
		t.Parallel()
		r := testredis.New(t)
		cfg := apptest.Config(t, r, "")
		plan := writePlan(t, three)
		code, out, stderr := enqueue(t, "-config", cfg, "month-end", "-plan", plan, "-period", "2026-10")
		require.Equal(t, 0, code, stderr)
		first := regexp.MustCompile(`run (month-end-\S+) \(`).FindStringSubmatch(out)
		require.NotNil(t, first, out)
		stdout, errOut, done := watchAgain(t, cfg, plan)
		code, _, stderr = enqueue(t, "-config", cfg, "run", "cancel", first[1])
		require.Equal(t, 0, code, stderr)
		select {
		case code := <-done:
			require.Equal(t, 1, code, stdout.String()+errOut.String())
		case <-time.After(20 * time.Second):
			t.Fatalf("month-end -wait did not end once the earlier run was cancelled:\n%s", stdout.String())
		}
		require.True(t, strings.HasSuffix(stdout.String(), "\nthe 3 reports queued before: 0 completed, 0 failed, 3 cancelled\n"), stdout.String())
	})
	t.Run("one queued before fails", func(t *testing.T) {
		t.Parallel()
		blocker := filepath.Join(t.TempDir(), "file")
		require.NoError(t, os.WriteFile(blocker, nil, 0o600))
		_, code, out := waitAgain(t, "reports:\n  - name: vat-return\n", "reports:\n  - name: vat-return\n", func(cfg string) string {
			cfg = strings.Replace(cfg, "output_dir: ", "output_dir: "+blocker+"/out #", 1)
			return strings.Replace(cfg, "max_retry: 2", "max_retry: 0", 1)
		})
		require.Equal(t, 1, code, out)
		require.Contains(t, out, "1 report already queued or running before this command: watching it too\n")
		require.Contains(t, out, "\nthe 1 report queued before: 0 completed, 1 failed\n"+
			`  FAILED vat-return (2026-10, tier regulatory): failed more times than max_retry allows (1 failure, max_retry 0): report "vat-return": output directory: mkdir `+blocker)
	})
}

// TestEnqueueAnyJob: enqueue job puts an order (or any routed job type)
// on its pool's queue, its payload checked first: a bad payload, an
// unknown type or a tier the pool does not serve exits 2 and enqueues
// nothing.
func TestEnqueueAnyJob(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	code, stdout, stderr := enqueue(t, "-config", cfg, "job", "-type", "order:create", "-payload", orderPayload)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "job order:create: enqueued (queue ")
	require.Equal(t, 1, status(t, cfg).Pools[0].Queues[0].Pending, "the order waits in the order pool's queue")

	code, stdout, stderr = enqueue(t, "-config", cfg, "job", "-type", "report:run", "-payload", `{"report":"vat-return","period":"2026-10"}`)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "job report:run: enqueued (tier regulatory, queue ")
	code, stdout, _ = enqueue(t, "-config", cfg, "job", "-type", "report:run", "-payload", `{"report":"vat-return","period":"2026-10"}`)
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "already queued or running", "a report through job keeps one job per report and period")

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad payload", []string{"-type", "order:create", "-payload", `{"region":"mars","category":"books","customer_id":7,"amount_cents":1}`},
			`enqueue job: job type "order:create": malformed payload: region "mars" is not one of`},
		{"not JSON", []string{"-type", "search:index", "-payload", `product=1`}, `enqueue job: job type "search:index": malformed payload: invalid character`},
		{"unknown job type", []string{"-type", "refund:issue", "-payload", `{}`}, `enqueue job: unknown job type "refund:issue" (job types: order:create, search:index, report:run)`},
		{"tier for a pool without tiers", []string{"-type", "order:create", "-payload", orderPayload, "-tier", "adhoc"}, `pool "order" has no tiers; got tier "adhoc"`},
		{"missing payload", []string{"-type", "order:create"}, "enqueue job: -type and -payload are required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := enqueue(t, append([]string{"-config", cfg, "job"}, tc.args...)...)
			require.Equal(t, 2, code, stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tc.want)
		})
	}
	require.Equal(t, 1, status(t, cfg).Pools[0].Queues[0].Pending, "nothing else was enqueued")
}

// TestHelpNamesTheDefaultConfig: enqueue -h says which config file is read
// without -config and what it points at.
func TestHelpNamesTheDefaultConfig(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := enqueue(t, "-h")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "usage: enqueue [-config FILE] <command> [flags]\n\n"+
		"  -config FILE  config file (default configs/worker.yaml:\n"+
		"                a real Redis at 127.0.0.1:6379 DB 1, embedded SQLite out/compartment.db)\n")

	// Without -config it reads configs/worker.yaml (here, in cmd/enqueue,
	// there is none).
	code, _, stderr = enqueue(t, "status")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "enqueue status: config configs/worker.yaml: 1 problem")
}

// TestNoRetryMarksInMessages: what a user reads says what is wrong, not
// asynq's " (skip retry for the task)", which a malformed payload's error
// and a permanently failed report's stored error carry for asynq.
func TestNoRetryMarksInMessages(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	code, stdout, stderr := enqueue(t, "-config", cfg, "job", "-type", "order:create", "-payload", `{"region":"mars","category":"books","customer_id":7,"amount_cents":1299}`)
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	require.Equal(t, `enqueue job: job type "order:create": malformed payload: region "mars" is not one of ["central" "east" "north" "south" "west"]`+"\nnothing was enqueued\n", stderr)

	code, _, stderr = enqueue(t, "-config", cfg, "job", "-type", "search:index", "-payload", `{"product_id":1,"title":"teapot","category":"garden","colour":"red"}`)
	require.Equal(t, 2, code)
	require.Equal(t, `enqueue job: job type "search:index": malformed payload: json: unknown field "colour"`+"\nnothing was enqueued\n", stderr)

	var out bytes.Buffer
	stored := queues.Permanent(errors.New(`unknown report "payroll"`)).Error() // as asynq keeps it
	require.Contains(t, stored, "(skip retry for the task)")
	created := time.Date(2026, 11, 1, 2, 0, 0, 0, time.UTC)
	run := queues.RunInfo{Kind: "month-end", CreatedAt: created, EndedAt: created.Add(time.Second), RunCounts: queues.RunCounts{Failed: 1},
		Failures: []queues.RunFailure{{JobID: "report:payroll:2026-10", Tier: "adhoc", Reason: stored}}}
	printRunEnd(&out, run, func(f queues.RunFailure) string { return "payroll (2026-10, tier " + f.Tier + ")" })
	require.Equal(t, "month-end finished in 1s: 0 completed, 1 failed\n  FAILED payroll (2026-10, tier adhoc): unknown report \"payroll\"\n", out.String())
}

// TestJobExample: enqueue job -example prints, without a config or Redis,
// each job type's payload fields and a command with a valid payload; the
// printed commands enqueue as they are.
func TestJobExample(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := enqueue(t, "-config", "/nonexistent.yaml", "job", "-type", "order:create", "-example")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, `order:create: records an order (a row in the orders table)
  FIELD         TYPE     MEANING
  region        string   sales region: central, east, north, south or west
  category      string   product category: apparel, books, electronics, garden, grocery or toys
  customer_id   integer  the customer's number, >= 1
  amount_cents  integer  the order's amount in cents, >= 1
  enqueue job -type order:create -payload '{"region":"north","category":"books","customer_id":7,"amount_cents":1299}'
`, stdout)

	code, stdout, stderr = enqueue(t, "job", "-example")
	require.Equal(t, 0, code, stderr)
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	commands := regexp.MustCompile(`(?m)^  enqueue job -type (\S+) -payload '(.*)'$`).FindAllStringSubmatch(stdout, -1)
	require.Len(t, commands, len(handlers.JobTypes()), stdout)
	for i, jt := range handlers.JobTypes() {
		require.Equal(t, jt, commands[i][1])
		require.Regexp(t, `(?m)^`+regexp.QuoteMeta(jt)+`: \S`, stdout, "every job type, with what it does")
		code, out, stderr := enqueue(t, "-config", cfg, "job", "-type", jt, "-payload", commands[i][2])
		require.Equal(t, 0, code, stderr)
		require.Contains(t, out, "job "+jt+": enqueued (")
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-type", "refund:issue", "-example"}, `enqueue job: unknown job type "refund:issue" (job types: order:create, search:index, report:run)` + "\n"},
		{[]string{"-type", "order:create", "-example", "-payload", "{}"}, "enqueue job: -example prints a job type's payload and enqueues nothing: give it only -type\n"},
		{[]string{"-type", "order:create"}, "enqueue job: -type and -payload are required (-example shows a payload)\n"},
	} {
		code, stdout, stderr := enqueue(t, append([]string{"job"}, tc.args...)...)
		require.Equal(t, 2, code, stderr)
		require.Empty(t, stdout)
		require.Equal(t, tc.want, stderr)
	}
}
