package main

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/queues"
)

// dependencyConfig writes the test config with a reports-db of 20 that
// every pool uses once per job, and an adaptive batch pool (min 1, size 2,
// max_size 4): the pools claim 3 + 2 + 4 of it.
func dependencyConfig(t *testing.T, r *testredis.Redis) string {
	t.Helper()
	path := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, path, "database:\n", "dependencies: [{name: reports-db, capacity: 20}]\ndatabase:\n")
	apptest.ReplaceInConfig(t, path, "[order:create]\n", "[order:create]\n    uses: {reports-db: 1}\n")
	apptest.ReplaceInConfig(t, path, "[search:index]\n", "[search:index]\n    uses: {reports-db: 1}\n")
	apptest.ReplaceInConfig(t, path, "    max_retry: 2\n", "    max_retry: 2\n    max_size: 4\n    uses: {reports-db: 1}\n    adaptive: {min: 1}\n")
	return path
}

// status shows each dependency's capacity against the pools' claims and
// use, and the adaptive pool's limit, its bounds and its last change, in
// text and in JSON; an operator's resize and its reset are in the limit's
// log.
func TestStatusShowsDependenciesAndAdaptiveLimit(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := dependencyConfig(t, r)

	code, out, stderr := enqueue(t, "-config", cfg, "status")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `ADAPTIVE\s+LIMIT\s+MIN\.\.MAX\s+CHANGES\s+LAST CHANGE\n`, out)
	require.Regexp(t, `\nbatch\s+2\s+1\.\.4\s+0\s+none yet\n`, out)
	require.Regexp(t, `DEPENDENCY\s+CAPACITY\s+CLAIMED\s+IN USE\s+BY POOL \(CLAIMED/IN USE\)\n`, out)
	require.Regexp(t, `\nreports-db\s+20\s+9\s+0\s+order 3/0, search 2/0, batch 4/0\n`, out)
	require.Contains(t, out, "A pool CLAIMS its size in effect x its uses of a dependency (an adaptive pool its max_size x uses)")

	st := status(t, cfg)
	require.Equal(t, []app.DependencyStatus{{Name: "reports-db", Capacity: 20, Claimed: 9, InUse: 0, Pools: []app.DependencyUse{
		{Pool: "order", Units: 1, Claimed: 3}, {Pool: "search", Units: 1, Claimed: 2}, {Pool: "batch", Units: 1, Claimed: 4},
	}}}, st.Dependencies)
	batch := st.Pools[2]
	require.Equal(t, "batch", batch.Name)
	require.NotNil(t, batch.Adaptive)
	require.Equal(t, queues.AdaptiveStatus{Min: 1, Max: 4, Limit: 2}, *batch.Adaptive, "before its first tick: the configured size")
	require.Equal(t, 2, batch.EffectiveSize)
	require.False(t, batch.Resized)
	for _, p := range st.Pools[:2] {
		require.Nil(t, p.Adaptive, "pool %s is not adaptive", p.Name)
	}
	// The JSON's names, as scripts read them.
	_, jsonOut, _ := enqueue(t, "-config", cfg, "status", "-json")
	var raw struct {
		Dependencies []map[string]any `json:"dependencies"`
		Pools        []map[string]any `json:"pools"`
	}
	require.NoError(t, json.Unmarshal([]byte(jsonOut), &raw))
	require.Len(t, raw.Dependencies, 1)
	require.Equal(t, map[string]any{"name": "reports-db", "capacity": 20.0, "claimed": 9.0, "in_use": 0.0, "pools": []any{
		map[string]any{"pool": "order", "units": 1.0, "claimed": 3.0, "in_use": 0.0},
		map[string]any{"pool": "search", "units": 1.0, "claimed": 2.0, "in_use": 0.0},
		map[string]any{"pool": "batch", "units": 1.0, "claimed": 4.0, "in_use": 0.0},
	}}, raw.Dependencies[0])
	require.Equal(t, map[string]any{"min": 1.0, "max": 4.0, "limit": 2.0, "baseline_ns": 0.0, "changes": 0.0}, raw.Pools[2]["adaptive"])
	require.NotContains(t, raw.Pools[0], "adaptive")

	// An operator's size holds the limit off, and is in its log; the pool
	// still claims its max_size.
	code, _, stderr = enqueue(t, "-config", cfg, "resize", "-pool", "batch", "-size", "3")
	require.Equal(t, 0, code, stderr)
	code, out, stderr = enqueue(t, "-config", cfg, "status")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `\nbatch\s+2 \(held off: an operator's size 3 is in effect\)\s+1\.\.4\s+0\s+none yet\n`, out)
	require.Regexp(t, `batch\s+cluster\s+3 \(resized; configured 2\) max 4\s`, out)
	require.Regexp(t, `\nreports-db\s+20\s+9\s+0\s+order 3/0, search 2/0, batch 4/0\n`, out)
	st = status(t, cfg)
	batch = st.Pools[2]
	require.True(t, batch.Resized)
	require.Equal(t, 3, batch.EffectiveSize)
	require.Len(t, batch.Adaptive.Log, 1)
	resized := batch.Adaptive.Log[0]
	require.Equal(t, 0, resized.From)
	require.Equal(t, 3, resized.To)
	require.Contains(t, resized.Reason, "an operator resized the pool")
	require.WithinDuration(t, time.Now(), resized.At, time.Minute)
	require.Zero(t, batch.Adaptive.Changes, "an operator's size is not a change of the limit")

	code, _, stderr = enqueue(t, "-config", cfg, "resize", "-pool", "batch", "-reset")
	require.Equal(t, 0, code, stderr)
	st = status(t, cfg)
	batch = st.Pools[2]
	require.False(t, batch.Resized)
	require.Equal(t, 2, batch.EffectiveSize, "the limit holds again")
	require.Len(t, batch.Adaptive.Log, 2, "newest first: the reset, then the resize")
	require.Contains(t, batch.Adaptive.Log[0].Reason, "an operator reset the size")
	require.Equal(t, queues.AdaptiveChange{At: batch.Adaptive.Log[0].At, Reason: batch.Adaptive.Log[0].Reason}, batch.Adaptive.Log[0], "From and To are 0 for a reset")
	require.Equal(t, resized.Reason, batch.Adaptive.Log[1].Reason)
}

// What status prints for dependencies and adaptive limits, from a status
// read elsewhere: jobs in use, a limit that moved, an operator's size,
// a dependency overbooked.
func TestPrintDependenciesAndAdaptive(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 10, 31, 12, 3, 4, 0, time.UTC)
	moved := &queues.AdaptiveStatus{Min: 1, Max: 6, Limit: 3, Reason: "jobs took 104ms against a baseline of 21ms", At: at, Changes: 4,
		Log: []queues.AdaptiveChange{
			{At: at.Add(time.Minute), To: 5, Reason: "an operator resized the pool (the adaptive limit waits for a reset)"},
			{At: at, From: 6, To: 3, Reason: "jobs took 104ms against a baseline of 21ms"},
		}}
	for _, tc := range []struct {
		name string
		st   app.Status
		want string
	}{
		{"none", app.Status{Pools: []app.PoolStatus{{Name: "order"}}}, ""},
		{"moved, and resized by an operator", app.Status{
			Pools: []app.PoolStatus{{Name: "batch", Scope: "cluster", Size: 2, EffectiveSize: 5, Resized: true, Adaptive: moved}},
			Dependencies: []app.DependencyStatus{
				{Name: "reports-db", Capacity: 20, Claimed: 20, InUse: 3, Pools: []app.DependencyUse{
					{Pool: "order", Units: 1, Claimed: 8, InUse: 1}, {Pool: "search", Units: 2, Claimed: 8}, {Pool: "batch", Units: 1, Claimed: 4, InUse: 2}}},
				{Name: "pricing-api", Capacity: 4, Claimed: 6, InUse: 0, Pools: []app.DependencyUse{{Pool: "order", Units: 2, Claimed: 6}}},
				{Name: "unused", Capacity: 1, Pools: []app.DependencyUse{}},
			}},
			"\nADAPTIVE  LIMIT                                            MIN..MAX  CHANGES  LAST CHANGE\n" +
				"batch     3 (held off: an operator's size 5 is in effect)  1..6      4        2026-10-31 12:03:04 6 → 3: jobs took 104ms against a baseline of 21ms\n" +
				"\nDEPENDENCY   CAPACITY  CLAIMED         IN USE  BY POOL (CLAIMED/IN USE)\n" +
				"reports-db   20        20              3       order 8/1, search 8/0, batch 4/2\n" +
				"pricing-api  4         6 (overbooked)  0       order 6/0\n" +
				"unused       1         0               0       -\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			printAdaptive(&out, tc.st)
			printDependencies(&out, tc.st)
			require.Equal(t, tc.want, out.String())
		})
	}
}
