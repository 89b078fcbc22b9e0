package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/quote"
	"github.com/lci-labs/compartment/internal/testredis"
)

// enqueueWithin runs the command and fails the test if it has not exited
// by the deadline (an endless input used to be read until the kernel
// killed the process).
func enqueueWithin(t *testing.T, d time.Duration, args ...string) (int, string, string) {
	t.Helper()
	type result struct {
		code           int
		stdout, stderr string
	}
	done := make(chan result, 1)
	go func() {
		var out, errOut bytes.Buffer
		code := run(context.Background(), cli.Env{Args: args, Stdout: &out, Stderr: &errOut, Getenv: noEnv})
		done <- result{code, out.String(), errOut.String()}
	}()
	select {
	case r := <-done:
		return r.code, r.stdout, r.stderr
	case <-time.After(d):
		t.Fatalf("enqueue %q did not exit within %s", args, d)
		return 0, "", ""
	}
}

// TestEndlessInputsExit2: a plan, a config or a catalog that is /dev/zero
// (or any file past yamlx.MaxFileSize) is refused at once with the limit,
// exit 2, and nothing is enqueued.
func TestEndlessInputsExit2(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skip("no /dev/zero")
	}
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	zeroCatalog := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, zeroCatalog, "reports: "+apptest.RepoPath("configs/reports.yaml"), "reports: /dev/zero")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"plan", []string{"-config", cfg, "month-end", "-plan", "/dev/zero", "-period", "2026-10"},
			"enqueue month-end: plan: /dev/zero is larger than the limit of 4 MiB"},
		{"config", []string{"-config", "/dev/zero", "status"},
			"enqueue status: config /dev/zero: 1 problem:\n  - /dev/zero is larger than the limit of 4 MiB"},
		{"catalog", []string{"-config", zeroCatalog, "report", "-name", "vat-return", "-period", "2026-10"},
			"report catalog: /dev/zero is larger than the limit of 4 MiB"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := enqueueWithin(t, 20*time.Second, tc.args...)
			require.Equal(t, 2, code, stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tc.want)
		})
	}
	require.Zero(t, pendingReports(status(t, cfg)), "nothing was enqueued")
}

// TestHugeValuesAreCut: a huge report name, period or plan entry is quoted
// in the one-line error cut to quote.Max bytes with its length, exit 2,
// and nothing is enqueued.
func TestHugeValuesAreCut(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	long := strings.Repeat("x", 5000)
	plan := writePlan(t, "reports:\n  - name: "+long+"\n  - name: vat-return\n    tier: "+long+"\n")
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"report name", []string{"-config", cfg, "report", "-name", long, "-period", "2026-10"},
			[]string{`enqueue report: unknown report "xxxx`, `... (5000 bytes) (catalog: vat-return,`}},
		{"report tier", []string{"-config", cfg, "report", "-name", "vat-return", "-period", "2026-10", "-tier", long},
			[]string{`enqueue report: priority: unknown tier "xxxx`, `... (5000 bytes) (tiers, highest first:`}},
		{"report period", []string{"-config", cfg, "report", "-name", "vat-return", "-period", long},
			[]string{`enqueue report: period "xxxx`, `... (5000 bytes) must be a month written YYYY-MM, like 2026-10`}},
		{"month-end period", []string{"-config", cfg, "month-end", "-plan", writePlan(t, "reports:\n  - name: vat-return\n"), "-period", long},
			[]string{`enqueue month-end: plan `, `period "xxxx`, `... (5000 bytes) must be a month written YYYY-MM`, "nothing was enqueued"}},
		{"month-end plan entries", []string{"-config", cfg, "month-end", "-plan", plan, "-period", "2026-10"},
			[]string{`reports[0] "xxxx`, `... (5000 bytes): unknown report`, `reports[1] "vat-return": priority: unknown tier "xxxx`, "nothing was enqueued"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := enqueue(t, tc.args...)
			require.Equal(t, 2, code, "%.600s", stderr)
			require.Empty(t, stdout)
			require.NotContains(t, stderr, strings.Repeat("x", quote.Max+1), "a value is cut to quote.Max bytes")
			require.Less(t, len(stderr), 1000, "%.1000s", stderr)
			for _, w := range tc.want {
				require.Contains(t, stderr, w)
			}
		})
	}
	require.Zero(t, pendingReports(status(t, cfg)), "nothing was enqueued")
}

// TestWrongFileIsNotEchoed: a config whose priorities or catalog path
// points at a file that is not one (say /etc/passwd), or a plan that is
// not a plan, is reported by line and kind, exit 2, without printing any
// of that file.
func TestWrongFileIsNotEchoed(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	secret := writePlan(t, "root:x:0:0:SECRETLINE\ndaemon:x:1:1:SECRETLINE2:/usr/sbin:/usr/sbin/nologin\n")
	cfg := apptest.Config(t, r, "")
	badPriorities := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, badPriorities, "priorities: "+apptest.RepoPath("configs/priorities.yaml"), "priorities: "+secret)
	badCatalog := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, badCatalog, "reports: "+apptest.RepoPath("configs/reports.yaml"), "reports: "+secret)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"priorities", []string{"-config", badPriorities, "report", "-name", "vat-return", "-period", "2026-10"},
			"priorities file " + secret + ": line 1: a string where a mapping was expected (is it the right file?)"},
		{"catalog", []string{"-config", badCatalog, "status"},
			"report catalog " + secret + ": line 1: a string where a mapping was expected (is it the right file?)"},
		{"plan", []string{"-config", cfg, "month-end", "-plan", secret, "-period", "2026-10"},
			"enqueue month-end: plan " + secret + ": line 1: a string where a mapping was expected (is it the right file?)\nnothing was enqueued"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := enqueue(t, tc.args...)
			require.Equal(t, 2, code, stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tc.want)
			require.NotContains(t, stderr, "SECRET")
			require.NotContains(t, stderr, "root:x")
		})
	}
	require.Zero(t, pendingReports(status(t, cfg)), "nothing was enqueued")
}
