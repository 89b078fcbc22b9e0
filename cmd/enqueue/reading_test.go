package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/queues"
)

// TestReadingDespiteOtherProblems: a config whose only problems do not
// concern reading the queues (here the connection budget: the pools need
// 7 connections, max_connections is 6) still lets an operator look: status,
// schedules and a breaker's state print the problem as a warning on stderr
// and show what they read. Every command that changes something refuses
// it with exit 2, and a problem that does concern reading stops the
// reading commands too.
func TestReadingDespiteOtherProblems(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "    breaker: {min_calls: 5}\n")
	code, _, stderr := enqueue(t, "-config", cfg, "report", "-name", "vat-return", "-period", "2026-10")
	require.Equal(t, 0, code, stderr)
	apptest.ReplaceInConfig(t, cfg, "max_connections: 10", "max_connections: 6")
	const budget = "pools need 7 database connections (order 3 + search 2 + batch 2) but database.max_connections is 6: raise max_connections, shrink the pools, or set database.allow_overbooking: true"
	warning := func(cmd string) string {
		return "enqueue " + cmd + ": warning: config " + cfg + ": 1 problem; reading goes on, but the worker and the commands that change something refuse this config until it is fixed:\n  - " + budget + "\n"
	}

	t.Run("reading commands warn and read", func(t *testing.T) {
		code, stdout, stderr := enqueue(t, "-config", cfg, "status")
		require.Equal(t, 0, code, stderr)
		require.Equal(t, warning("status"), stderr)
		require.Regexp(t, `:batch:regulatory\s+regulatory\s+1\s`, stdout, "the status shows the waiting report")

		code, stdout, stderr = enqueue(t, "-config", cfg, "status", "-json")
		require.Equal(t, 0, code, stderr)
		require.Equal(t, warning("status"), stderr)
		var st app.Status
		require.NoError(t, json.Unmarshal([]byte(stdout), &st), "stdout stays JSON")
		require.Equal(t, 1, pendingReports(st))

		code, stdout, stderr = enqueue(t, "-config", cfg, "schedules")
		require.Equal(t, 0, code, stderr)
		require.Equal(t, warning("schedules"), stderr)
		require.Equal(t, "no schedules in "+cfg+" (add a schedules: list; see docs/SCHEDULES.md)\n", stdout)

		code, stdout, stderr = enqueue(t, "-config", cfg, "breaker", "-pool", "batch")
		require.Equal(t, 0, code, stderr)
		require.Equal(t, warning("breaker"), stderr)
		require.Contains(t, stdout, "breaker of pool batch: closed;")
	})

	t.Run("commands that change something refuse", func(t *testing.T) {
		for _, args := range [][]string{
			{"report", "-name", "trial-balance", "-period", "2026-10"},
			{"month-end", "-plan", apptest.RepoPath("configs/month-end.yaml"), "-period", "2026-10"},
			{"job", "-type", "order:create", "-payload", orderPayload},
			{"promote", "-name", "vat-return", "-period", "2026-10", "-tier", "adhoc"},
			{"resize", "-pool", "batch", "-size", "1"},
			{"schedule", "run", "month-end", "-period", "2026-10"},
			{"breaker", "-pool", "batch", "open"},
		} {
			t.Run(args[0], func(t *testing.T) {
				code, stdout, stderr := enqueue(t, append([]string{"-config", cfg}, args...)...)
				require.Equal(t, 2, code, stderr)
				require.Empty(t, stdout)
				require.Equal(t, "enqueue "+args[0]+": config "+cfg+": 1 problem:\n  - "+budget+"\n", stderr)
			})
		}
		apptest.ReplaceInConfig(t, cfg, "max_connections: 6", "max_connections: 10")
		st := status(t, cfg)
		require.Equal(t, 1, pendingReports(st), "nothing was enqueued or moved")
		require.Equal(t, queues.BreakerClosed, st.Pools[2].Breaker.State)
		require.False(t, st.Pools[2].Resized)
		apptest.ReplaceInConfig(t, cfg, "max_connections: 10", "max_connections: 6")
	})

	t.Run("problems that concern reading stop it", func(t *testing.T) {
		for _, tc := range []struct{ name, old, new, want string }{
			{"redis settings", "redis:\n", "redis:\n  embedded: true\n", "redis: set either url or embedded: true, not both"},
			{"unknown key", "shutdown_timeout: 5s", "shutdown_timeout: 5s\ncolour: blue", "unknown key colour"},
			{"pools that cannot be built", "[report:run, report:bundle]", "[report:run, report:bundle, order:create]", `job type "order:create" is routed to two pools: "order" and "batch"`},
			{"invalid YAML", "pools:", "pools: [", "yaml"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				path := apptest.Config(t, r, "")
				apptest.ReplaceInConfig(t, path, "max_connections: 10", "max_connections: 6")
				apptest.ReplaceInConfig(t, path, tc.old, tc.new)
				code, stdout, stderr := enqueue(t, "-config", path, "status")
				require.Equal(t, 2, code, stderr)
				require.Empty(t, stdout)
				require.Contains(t, stderr, "enqueue status: config "+path+": ")
				require.Contains(t, stderr, tc.want)
				require.NotContains(t, stderr, "warning")
				if tc.name != "invalid YAML" {
					require.Contains(t, stderr, budget, "every problem is listed")
				}
			})
		}
	})
}
