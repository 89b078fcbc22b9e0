package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
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
