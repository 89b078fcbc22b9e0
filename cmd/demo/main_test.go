package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/demo"
	"github.com/lci-labs/compartment/internal/testredis"
)

func TestUsage(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-bogus"}, 2, "demo: flag provided but not defined: -bogus (run with -h for help)"},
		{[]string{"-orders-per-sec", "0"}, 2, "demo: -orders-per-sec and -searches-per-sec must be >= 1, -warmup, -order-timeout and -slow-for > 0"},
		{[]string{"-order-timeout", "0s"}, 2, "demo: -orders-per-sec and -searches-per-sec must be >= 1, -warmup, -order-timeout and -slow-for > 0"},
		{[]string{"-slow-for", "0s"}, 2, "demo: -orders-per-sec and -searches-per-sec must be >= 1, -warmup, -order-timeout and -slow-for > 0"},
		{[]string{"-skip-slowdown=maybe"}, 2, "demo: invalid boolean value"},
		{[]string{"-skip-outage=maybe"}, 2, "demo: invalid boolean value"},
		{[]string{"stray"}, 2, `demo: unexpected argument "stray"`},
		{[]string{"-config", "/nonexistent.yaml"}, 2, "demo: config /nonexistent.yaml: 1 problem"},
		{[]string{"-http", "8089"}, 2, `demo: -http: "8089" is not host:port`},
		{[]string{"-outage-min", "-1s"}, 2, "demo: -outage-min must be >= 0"},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), cli.Env{Args: tc.args, Stdout: &out, Stderr: &errOut, Getenv: noEnv})
		require.Equal(t, tc.code, code, tc.args)
		require.Contains(t, errOut.String(), tc.want)
	}
	var out bytes.Buffer
	require.Equal(t, 0, run(context.Background(), cli.Env{Args: []string{"-h"}, Stdout: &out, Stderr: &out, Getenv: noEnv}))
	require.Contains(t, out.String(), "usage: demo [flags]")
	require.Contains(t, out.String(), "order p99\nduring the month-end at least 5x its p99 before, or at least 1 order\ntimed out", "the thresholds, said")
	require.Contains(t, out.String(), "the report database 5x slower")
	require.Contains(t, out.String(), "-skip-outage")
	require.Contains(t, out.String(), "-skip-slowdown")
	require.Contains(t, out.String(), "-slow-for")
	require.Contains(t, out.String(), "-order-timeout")
	require.Contains(t, out.String(), "-outage-min")
}

// TestRunAfterOnly runs the command with the walls only, on a small seed,
// to check that its flags reach the run and that it exits 0 when the walls
// hold. internal/demo tests the three parts.
func TestRunAfterOnly(t *testing.T) {
	path := apptest.Config(t, testredis.New(t), "report_min_duration: 100ms\n")
	apptest.ReplaceInConfig(t, path, "seed_orders: 3000", "seed_orders: 300")
	var out, errOut bytes.Buffer
	code := run(context.Background(), cli.Env{
		Args: []string{
			"-config", path, "-plan", apptest.RepoPath("configs/month-end.yaml"), "-periods", "2026-10", "-skip-outage", "-skip-slowdown",
			"-warmup", "200ms", "-orders-per-sec", "10", "-searches-per-sec", "5", "-order-timeout", "1500ms",
			"-http", "127.0.0.1:0",
		},
		Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" },
	})
	require.Equal(t, 0, code, out.String()+errOut.String())
	require.Contains(t, out.String(), "month-end of 10 reports for [2026-10]")
	require.Contains(t, out.String(), "dashboard: http://127.0.0.1:", "the dashboard's URL is printed")
	require.Contains(t, out.String(), "order traffic 10/s and search traffic 5/s, a 200ms warm-up")
	require.Contains(t, out.String(), "an order request times out after 1.5s")
	require.NotContains(t, out.String(), "=== BEFORE")
	require.NotContains(t, out.String(), "=== SLOWDOWN")
	require.Contains(t, out.String(), "BEFORE: skipped (-skip-outage): the exit code does not cover it.")
	require.Contains(t, out.String(), "SLOWDOWN: skipped (-skip-slowdown): the exit code does not cover it.")
	require.Contains(t, out.String(), "AFTER: the walls held: 10/10 reports completed")
	require.Contains(t, out.String(), "\nexit 0: the run showed what it should (see above)\n")
}

// TestReportExitCode: exit 0 only when the outage reproduced and the walls
// held; a run whose BEFORE phase did not show the outage says so and
// exits 1.
func TestReportExitCode(t *testing.T) {
	ms := time.Millisecond
	held := demo.Phase{ReportsTotal: 4, ReportsDone: 4, Pools: []demo.PoolResult{{Name: "batch", Size: 2, MaxConcurrent: 2, MaxConns: 2}}}
	outage := &demo.Phase{
		OrderBefore: demo.Orders{Latency: demo.Latency{N: 10, P50: 20 * ms, P99: 40 * ms, Max: 40 * ms}},
		OrderDuring: demo.Orders{Latency: demo.Latency{N: 10, P50: 900 * ms, P99: 3000 * ms, Max: 3000 * ms}, TimedOut: 4},
	}
	noOutage := &demo.Phase{
		OrderBefore: demo.Orders{Latency: demo.Latency{N: 10, P50: 20 * ms, P99: 40 * ms, Max: 40 * ms}},
		OrderDuring: demo.Orders{Latency: demo.Latency{N: 10, P50: 30 * ms, P99: 60 * ms, Max: 60 * ms}},
	}
	followed := demo.SlowdownAct{Pool: "batch", Min: 1, Max: 4, Factor: 5, StartLimit: 4, Lowest: 1, EndLimit: 4, FellAfter: 3 * time.Second, BackAfter: 8 * time.Second,
		OrdersEnqueued: 100, OrdersCompleted: 100, Starts: 20, MostAtOnce: 4, ReportsTotal: 20, ReportsDone: 20}
	notBack := followed
	notBack.BackAfter, notBack.EndLimit = -1, 2
	for _, tc := range []struct {
		name string
		s    demo.Summary
		code int
		want string
	}{
		{"the outage reproduced, the walls held", demo.Summary{Outage: outage, Walls: held, OrderTimeout: time.Second}, 0, "BEFORE: the outage reproduced"},
		{"BEFORE skipped, the walls held", demo.Summary{Walls: held, OrderTimeout: time.Second}, 0, "BEFORE: skipped (-skip-outage)"},
		{"the outage did not reproduce", demo.Summary{Outage: noOutage, Walls: held, OrderTimeout: time.Second}, 1, "BEFORE: the outage did NOT reproduce: order p99 during the month-end was 1.5x its p99 before (threshold 5x)"},
		{"a tier was overtaken", demo.Summary{Outage: outage, Walls: held, Inversions: 1, OrderTimeout: time.Second}, 1, "AFTER: the walls did NOT hold: 1 reports overtook a higher tier"},
		{"the limit followed the database", demo.Summary{Outage: outage, Walls: held, Slowdown: &followed, OrderTimeout: time.Second}, 0, "SLOWDOWN: the adaptive limit followed the database"},
		{"the limit was not back", demo.Summary{Outage: outage, Walls: held, Slowdown: &notBack, OrderTimeout: time.Second}, 1, "SLOWDOWN: the adaptive limit did NOT do its part: the limit was not back at 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			require.Equal(t, tc.code, report(&out, tc.s))
			require.Contains(t, out.String(), tc.want)
			require.Contains(t, out.String(), map[int]string{0: "\nexit 0: ", 1: "\nexit 1: the run did NOT show what it should"}[tc.code])
		})
	}
}
