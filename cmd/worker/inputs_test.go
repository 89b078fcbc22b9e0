package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/testredis"
)

// runWorkerWithin runs the worker and fails the test if it has not exited
// by the deadline (an endless config used to be read until the kernel
// killed the process).
func runWorkerWithin(t *testing.T, d time.Duration, args ...string) (int, string) {
	t.Helper()
	type result struct {
		code   int
		stderr string
	}
	done := make(chan result, 1)
	go func() {
		var out, errOut apptest.SyncBuffer
		code := run(context.Background(), cli.Env{Args: args, Stdout: &out, Stderr: &errOut, Getenv: noEnv})
		done <- result{code, errOut.String()}
	}()
	select {
	case r := <-done:
		return r.code, r.stderr
	case <-time.After(d):
		t.Fatalf("worker %q did not exit within %s", args, d)
		return 0, ""
	}
}

// TestEndlessInputsExit2: a config, a catalog or a priorities file that is
// /dev/zero (or any file past yamlx.MaxFileSize) is refused at once with
// the limit, exit 2.
func TestEndlessInputsExit2(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skip("no /dev/zero")
	}
	r := testredis.New(t)
	zeroCatalog := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, zeroCatalog, "reports: "+apptest.RepoPath("configs/reports.yaml"), "reports: /dev/zero")
	zeroPriorities := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, zeroPriorities, "priorities: "+apptest.RepoPath("configs/priorities.yaml"), "priorities: /dev/zero")
	cases := []struct {
		name, config, want string
	}{
		{"config", "/dev/zero", "worker: config /dev/zero: 1 problem:\n  - /dev/zero is larger than the limit of 4 MiB"},
		{"catalog", zeroCatalog, "report catalog: /dev/zero is larger than the limit of 4 MiB"},
		{"priorities", zeroPriorities, "priorities: /dev/zero is larger than the limit of 4 MiB"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stderr := runWorkerWithin(t, 20*time.Second, "-config", tc.config)
			require.Equal(t, 2, code, stderr)
			require.Contains(t, stderr, tc.want)
		})
	}
}

// TestWrongFileIsNotEchoed: a config whose priorities or catalog path
// points at a file that is not one (say /etc/passwd) says so by line and
// kind, exit 2, without printing any of that file.
func TestWrongFileIsNotEchoed(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	secret := filepath.Join(t.TempDir(), "passwd")
	require.NoError(t, os.WriteFile(secret, []byte("root:x:0:0:SECRETLINE\ndaemon:x:1:1:SECRETLINE2:/usr/sbin:/usr/sbin/nologin\n"), 0o600))
	short := filepath.Join(t.TempDir(), "short")
	require.NoError(t, os.WriteFile(short, []byte("SECRETLINE\n"), 0o600))
	cases := []struct {
		name, old, file, want string
	}{
		{"priorities", "priorities: " + apptest.RepoPath("configs/priorities.yaml"), secret,
			"priorities file " + secret + ": line 1: a string where a mapping was expected (is it the right file?)"},
		{"catalog", "reports: " + apptest.RepoPath("configs/reports.yaml"), secret,
			"report catalog " + secret + ": line 1: a string where a mapping was expected (is it the right file?)"},
		{"short priorities", "priorities: " + apptest.RepoPath("configs/priorities.yaml"), short,
			"priorities file " + short + ": line 1: a string where a mapping was expected (is it the right file?)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := apptest.Config(t, r, "")
			key, _, _ := strings.Cut(tc.old, " ")
			apptest.ReplaceInConfig(t, cfg, tc.old, key+" "+tc.file)
			code, stderr := runWorkerWithin(t, 20*time.Second, "-config", cfg)
			require.Equal(t, 2, code, stderr)
			require.Contains(t, stderr, tc.want)
			require.NotContains(t, stderr, "SECRET")
			require.NotContains(t, stderr, "root:x")
		})
	}
}
