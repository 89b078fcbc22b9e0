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

// replaceInConfig rewrites the config file at path, replacing old (which
// must be there) with new.
func replaceInConfig(t *testing.T, path, old, new string) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(data), old)
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(data), old, new, 1)), 0o600))
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
	replaceInConfig(t, zeroCatalog, "reports: "+apptest.RepoPath("configs/reports.yaml"), "reports: /dev/zero")
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
