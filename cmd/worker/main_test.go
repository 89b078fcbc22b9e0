package main

import (
	"context"
	"encoding/json"
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

func noEnv(string) string { return "" }

func runWorker(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut apptest.SyncBuffer
	code := run(context.Background(), cli.Env{Args: args, Stdout: &out, Stderr: &errOut, Getenv: noEnv})
	return code, out.String(), errOut.String()
}

// servingWorker is a worker run in the test's process, serving.
type servingWorker struct {
	cancel func()
	done   chan int
	log    *apptest.SyncBuffer // its stderr
}

// startWorker runs the worker with env (Args, Getenv, Reload; noEnv when
// Getenv is nil) until it serves, failing the test if it exits first or
// does not start within 30 s. The worker stops when the test ends, if
// stop was not called.
func startWorker(t *testing.T, env cli.Env) *servingWorker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &servingWorker{cancel: cancel, done: make(chan int, 1), log: &apptest.SyncBuffer{}}
	ready := make(chan struct{})
	env.Stdout, env.Stderr, env.Ready = &apptest.SyncBuffer{}, w.log, func() { close(ready) }
	if env.Getenv == nil {
		env.Getenv = noEnv
	}
	go func() { w.done <- run(ctx, env) }()
	select {
	case <-ready:
	case code := <-w.done:
		t.Fatalf("worker exited %d before serving; log:\n%s", code, w.log.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("worker did not start; log:\n%s", w.log.String())
	}
	return w
}

// stop cancels the worker's context, as SIGTERM does, and requires a clean
// exit within 30 s.
func (w *servingWorker) stop(t *testing.T) {
	t.Helper()
	w.cancel()
	select {
	case code := <-w.done:
		require.Equal(t, 0, code, w.log.String())
	case <-time.After(30 * time.Second):
		t.Fatal("worker did not stop")
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	code, _, stderr := runWorker(t, "-bogus")
	require.Equal(t, 2, code)
	require.Equal(t, "worker: flag provided but not defined: -bogus (run with -h for help)\n", stderr)

	code, _, stderr = runWorker(t, "-config", "x.yaml", "extra")
	require.Equal(t, 2, code)
	require.Equal(t, "worker: unexpected argument \"extra\" (run with -h for help)\n", stderr)

	code, _, stderr = runWorker(t, "-log-format", "xml")
	require.Equal(t, 2, code)
	require.Equal(t, "worker: -log-format \"xml\": use text or json\n", stderr)

	code, stdout, _ := runWorker(t, "-h")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "usage: worker [-config FILE]")
	require.Contains(t, stdout, "  -config file\n    \tconfig file (default configs/worker.yaml: a real Redis at 127.0.0.1:6379 DB 1, embedded SQLite out/compartment.db)\n",
		"-h names the default config and what it points at, once")
	require.NotContains(t, stdout, `(default "configs/worker.yaml")`)

	// Without -config the worker reads configs/worker.yaml (here, in
	// cmd/worker, there is none).
	code, _, stderr = runWorker(t)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "worker: config configs/worker.yaml: 1 problem")

	code, _, stderr = runWorker(t, "-config", filepath.Join(t.TempDir(), "none.yaml"))
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "none.yaml: no such file or directory")
}

func TestInvalidConfigExits2WithEveryProblem(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	path := apptest.Config(t, r, "")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	body := strings.Replace(string(data), "size: 3", "size: 0", 1)
	body = strings.Replace(body, "[report:run, report:bundle]", "[report:run, report:bundle, order:create]", 1)
	body = strings.Replace(body, "shutdown_timeout: 5s", "shutdown_timeout: 5s\ncolour: blue", 1)
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))

	code, _, stderr := runWorker(t, "-config", path)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "worker: config "+path+": 3 problems:\n")
	require.Contains(t, stderr, "  - line 8: unknown key colour (the keys here are redis, namespace,", "an unknown key is one problem among the others, in the file's own words")
	require.NotContains(t, stderr, "app.File", "no Go type names")
	require.Contains(t, stderr, `  - pool "order": size must be >= 1, got 0`)
	require.Contains(t, stderr, `  - job type "order:create" is routed to two pools: "order" and "batch"`)
}

func TestRedisUnreachableExits1(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	path := apptest.Config(t, r, "")
	data, _ := os.ReadFile(path)
	body := strings.Replace(string(data), r.URL, "redis://127.0.0.1:1/5", 1)
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))

	code, _, stderr := runWorker(t, "-config", path)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "worker: redis at 127.0.0.1:1 is unreachable: ")
}

// TestRunsUntilSignal starts the worker, checks the one log line per pool,
// then cancels (as SIGTERM does) and expects a clean exit.
func TestRunsUntilSignal(t *testing.T) {
	r := testredis.New(t)
	path := apptest.Config(t, r, "")
	w := startWorker(t, cli.Env{Args: []string{"-config", path, "-log-format", "json"}})
	w.stop(t)
	errOut := w.log

	type line struct {
		Msg    string   `json:"msg"`
		Pool   string   `json:"pool"`
		Size   int      `json:"size"`
		Queues []string `json:"queues"`
	}
	var started []line
	for _, raw := range strings.Split(strings.TrimSpace(errOut.String()), "\n") {
		var l line
		require.NoError(t, json.Unmarshal([]byte(raw), &l), raw)
		if l.Msg == "pool started" {
			started = append(started, l)
		}
	}
	require.Len(t, started, 3)
	require.Equal(t, "order", started[0].Pool)
	require.Equal(t, 3, started[0].Size)
	batch := started[2]
	require.Equal(t, "batch", batch.Pool)
	require.Len(t, batch.Queues, 4)
	require.True(t, strings.HasSuffix(batch.Queues[0], ":batch:regulatory"), "highest tier first: %v", batch.Queues)
	require.True(t, strings.HasSuffix(batch.Queues[3], ":batch:adhoc"))
	require.Contains(t, errOut.String(), "all pools stopped")
}
