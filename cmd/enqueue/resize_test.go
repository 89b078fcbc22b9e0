package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// An operator resizes the batch pool and gives it back its configured
// size; status shows the configured and the effective size. Bad input
// exits 2 and changes nothing.
func TestResizeCommand(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, cfg, "    max_retry: 2\n", "    max_retry: 2\n    max_size: 4\n")
	apptest.ReplaceInConfig(t, cfg, "[order:create]\n", "[order:create]\n    scope: process\n")

	code, out, stderr := enqueue(t, "-config", cfg, "resize", "-pool", "batch", "-size", "4")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "pool batch: size 4 in every worker process (was 2; configured 2, max 4)\n", out)
	batch := status(t, cfg).Pools[2]
	require.Equal(t, "batch", batch.Name)
	require.Equal(t, 2, batch.Size)
	require.Equal(t, 4, batch.EffectiveSize)
	require.True(t, batch.Resized)
	require.Equal(t, 4, batch.MaxSize)
	code, out, stderr = enqueue(t, "-config", cfg, "status")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `batch\s+cluster\s+4 \(resized; configured 2\)\s+0`, out)

	// Bad input: exit 2, nothing changed.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"resize", "-pool", "batch", "-size", "5"}, `pool "batch": size must be from 1 to its max_size 4, got 5`},
		{[]string{"resize", "-pool", "batch", "-size", "0"}, `pool "batch": size must be from 1 to its max_size 4, got 0`},
		{[]string{"resize", "-pool", "order", "-size", "2"}, `pool "order" is scoped per process`},
		{[]string{"resize", "-pool", "search", "-size", "3"}, `pool "search": size must be from 1 to its max_size 2, got 3`},
		{[]string{"resize", "-pool", "nope", "-size", "2"}, `unknown pool "nope"`},
		{[]string{"resize", "-size", "2"}, "-pool is required"},
		{[]string{"resize", "-pool", "batch"}, "give either -size N or -reset"},
		{[]string{"resize", "-pool", "batch", "-size", "3", "-reset"}, "give either -size N or -reset"},
	} {
		code, _, stderr = enqueue(t, append([]string{"-config", cfg}, tc.args...)...)
		require.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
	require.Equal(t, 4, status(t, cfg).Pools[2].EffectiveSize, "nothing changed")

	code, out, stderr = enqueue(t, "-config", cfg, "resize", "-pool", "batch", "-reset", "-json")
	require.Equal(t, 0, code, stderr)
	var res struct {
		Pool          string
		Before, After queues.PoolSize
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, queues.PoolSize{Configured: 2, Effective: 4, Resized: true, Max: 4}, res.Before)
	require.Equal(t, queues.PoolSize{Configured: 2, Effective: 2, Max: 4}, res.After)
	require.False(t, status(t, cfg).Pools[2].Resized)
}

// A resize from a config whose max_size is larger than the running
// worker's: the size is set, but the one live worker can run only its own
// max_size of the pool's jobs. resize says so, status shows what the
// workers can run beside the size, and the worker logs it.
func TestResizeAboveWhatTheWorkersCanRun(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	workerCfg := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, workerCfg, "    max_retry: 2\n", "    max_retry: 2\n    max_size: 4\n")
	loaded, err := app.Load(workerCfg, nil)
	require.NoError(t, err)
	logs := &apptest.SyncBuffer{}
	w, err := app.NewWorker(context.Background(), loaded, app.WorkerOptions{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	t.Cleanup(w.Close)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, w.Stop(context.Background())) })

	// The operator's config allows 100 and enough connections for it.
	opCfg := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, opCfg, "namespace: ", "namespace: "+loaded.Namespace+"\n# ")
	apptest.ReplaceInConfig(t, opCfg, "    max_retry: 2\n", "    max_retry: 2\n    max_size: 100\n")
	apptest.ReplaceInConfig(t, opCfg, "max_connections: 10", "max_connections: 110")
	testwait.For(t, 10*time.Second, "the worker to say what it can run", func() bool {
		return status(t, opCfg).Pools[2].WorkersCanRun == 4
	})

	code, out, stderr := enqueue(t, "-config", opCfg, "resize", "-pool", "batch", "-size", "60")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "pool batch: size 60 in every worker process (was 2; configured 2, max 100)\n"+
		"note: the 1 worker processes running pool batch now can run 4 of its jobs at once between them (each up to its own max_size): the size 60 is reached only when more workers start\n", out)
	batch := status(t, opCfg).Pools[2]
	require.Equal(t, 60, batch.EffectiveSize)
	require.Equal(t, 4, batch.WorkersCanRun)
	code, out, stderr = enqueue(t, "-config", opCfg, "status")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `batch\s+cluster\s+60 \(resized; configured 2\) max 100 \(workers can run 4\)\s+1\s`, out)
	testwait.For(t, 15*time.Second, "the worker to log that the size is out of its reach", func() bool {
		return strings.Contains(logs.String(), `msg="pool: the size in effect is more than the live workers can run; it is reached only when more workers start (or resize it down)" pool=batch size=60 workers=1 workers_can_run=4`)
	})

	code, out, stderr = enqueue(t, "-config", opCfg, "resize", "-pool", "batch", "-size", "3", "-json")
	require.Equal(t, 0, code, stderr)
	var res struct {
		Workers       int64 `json:"workers"`
		WorkersCanRun int64 `json:"workers_can_run"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, int64(1), res.Workers)
	require.Equal(t, int64(4), res.WorkersCanRun)
	testwait.For(t, 15*time.Second, "the worker to log that it can run the size again", func() bool {
		return strings.Contains(logs.String(), `msg="pool: the live workers can run the size in effect again" pool=batch size=3 workers=1 workers_can_run=4`)
	})
}

// A resize that would take the pools past a dependency's capacity exits 2
// with every number and changes nothing.
func TestResizeOverBudget(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, cfg, "    max_retry: 2\n", "    max_retry: 2\n    max_size: 4\n    uses: {reports-db: 2}\n")
	apptest.ReplaceInConfig(t, cfg, "database:\n", "dependencies: [{name: reports-db, capacity: 6}]\ndatabase:\n")

	code, out, stderr := enqueue(t, "-config", cfg, "resize", "-pool", "batch", "-size", "3")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "pool batch: size 3 in every worker process")
	code, _, stderr = enqueue(t, "-config", cfg, "resize", "-pool", "batch", "-size", "4")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, `resize pool "batch" to 4: over a dependency's budget: dependency "reports-db": the pools claim 8 but its capacity is 6: batch 4×2 = 8 (size)`)
	require.Equal(t, 3, status(t, cfg).Pools[2].EffectiveSize, "nothing changed")
}
