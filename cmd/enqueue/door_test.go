package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
)

// The door's refusals exit 3 with the reason, enqueue nothing, and
// show in status.
func TestDoorRefusals(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, cfg, "    max_retry: 2\n", "    max_retry: 2\n    max_backlog: 6\n    tier_limits: {adhoc: 2}\n")
	apptest.ReplaceInConfig(t, cfg, "    job_types: [order:create]\n", "    job_types: [order:create]\n    enqueue_rate: {limit: 2, per: 1h}\n")
	apptest.ReplaceInConfig(t, cfg, "    job_types: [search:index]\n", "    job_types: [search:index]\n    enqueue_rate_per_key: {limit: 1, per: 1h}\n")

	// The month-end plan has ten reports: it does not fit, and says by how
	// much per tier.
	code, stdout, stderr := enqueue(t, "-config", cfg, "month-end", "-plan", apptest.RepoPath("configs/month-end.yaml"), "-period", "2026-10")
	require.Equal(t, 3, code, stdout+stderr)
	require.Equal(t, `enqueue month-end: pool "batch" is full for tier "management": backlog 0/6; the request needs 10 (regulatory: room 6, needs 2; close: room 4, needs 3; management: room 1, needs 3; adhoc: room 0, needs 2); nothing was enqueued`+"\n", stderr)
	require.Zero(t, pendingReports(status(t, cfg)))

	// Ad-hoc reports stop at their tier's limit; regulatory ones still go in.
	for _, name := range []string{"refunds-analysis", "customer-cohorts"} {
		code, _, stderr = enqueue(t, "-config", cfg, "report", "-name", name, "-period", "2026-10")
		require.Equal(t, 0, code, stderr)
	}
	code, _, stderr = enqueue(t, "-config", cfg, "report", "-name", "top-customers", "-period", "2026-10", "-tier", "adhoc")
	require.Equal(t, 3, code, stderr)
	require.Equal(t, `enqueue report: pool "batch" is full for tier "adhoc": backlog 2/2; nothing was enqueued`+"\n", stderr)
	code, _, stderr = enqueue(t, "-config", cfg, "report", "-name", "vat-return", "-period", "2026-10")
	require.Equal(t, 0, code, stderr)

	// Rates: two orders an hour, then a refusal that says when to retry.
	order := `{"region":"north","category":"books","customer_id":7,"amount_cents":1299}`
	for range 2 {
		code, _, stderr = enqueue(t, "-config", cfg, "job", "-type", "order:create", "-payload", order)
		require.Equal(t, 0, code, stderr)
	}
	code, _, stderr = enqueue(t, "-config", cfg, "job", "-type", "order:create", "-payload", order)
	require.Equal(t, 3, code, stderr)
	require.Regexp(t, `^enqueue job: pool "order": enqueue_rate 2 per 1h0m0s \(burst 2\) reached; retry after 29m5\d.*s; nothing was enqueued\n$`, stderr)

	// One search per key: each tenant on its own.
	search := `{"product_id":1,"title":"A book","category":"books"}`
	code, _, stderr = enqueue(t, "-config", cfg, "job", "-type", "search:index", "-payload", search, "-rate-key", "tenant-a")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = enqueue(t, "-config", cfg, "job", "-type", "search:index", "-payload", search, "-rate-key", "tenant-a")
	require.Equal(t, 3, code, stderr)
	require.Contains(t, stderr, `enqueue_rate_per_key for key "tenant-a" 1 per 1h0m0s (burst 1) reached; retry after `)
	code, _, stderr = enqueue(t, "-config", cfg, "job", "-type", "search:index", "-payload", search, "-rate-key", "tenant-b")
	require.Equal(t, 0, code, stderr)

	st := status(t, cfg)
	batch := st.Pools[2]
	require.Equal(t, 3, batch.Backlog)
	require.Equal(t, 6, batch.MaxBacklog)
	refused := map[string]map[string]int64{}
	limits := map[string]int{}
	for _, q := range batch.Queues {
		refused[q.Tier], limits[q.Tier] = q.Refused, q.BacklogLimit
	}
	require.Equal(t, map[string]int{"regulatory": 6, "close": 6, "management": 6, "adhoc": 2}, limits)
	require.Equal(t, map[string]map[string]int64{
		"regulatory": {"backlog": 2}, "close": {"backlog": 3}, "management": {"backlog": 3}, "adhoc": {"backlog": 3},
	}, refused)
	require.Equal(t, int64(1), st.Pools[0].Queues[0].Refused["rate"])
	require.Equal(t, "enqueue_rate", st.Pools[0].Rates[0].Limit)

	code, out, stderr := enqueue(t, "-config", cfg, "status")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "DOOR")
	require.Regexp(t, `batch\s+adhoc\s+3\s+2\s+3\s+0`, out)
	require.Regexp(t, `order\s+-\s+2\s+-\s+0\s+1`, out)
	require.Contains(t, out, "order: enqueue_rate 2 per 1h0m0s (burst 2)")
	var raw map[string]any
	_, jsonOut, _ := enqueue(t, "-config", cfg, "status", "-json")
	require.NoError(t, json.Unmarshal([]byte(jsonOut), &raw))
}

// Bad door settings are config errors, each named, exit 2.
func TestDoorConfigErrors(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, cfg, "    max_retry: 2\n", "    max_retry: 2\n    max_backlog: 6\n    tier_limits: {adhoc: 9, urgent: 1}\n    start_rate: {limit: 0, per: 1s}\n")
	code, _, stderr := enqueue(t, "-config", cfg, "status")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, `pool "batch": tier_limits: tier "adhoc" limit 9 is above the pool's max_backlog 6`)
	require.Contains(t, stderr, `pool "batch": tier_limits: tier "urgent" is not one of the pool's tiers`)
	require.Contains(t, stderr, `pool "batch": start_rate: limit must be >= 1, got 0`)
}

// TestRateKeyRequired: into a pool that limits enqueues per caller, an
// enqueue that names no caller is refused as bad input (exit 2) before
// anything is enqueued, rather than escaping the limit; a pool without
// that limit takes enqueues without a key as before.
func TestRateKeyRequired(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, cfg, "    job_types: [search:index]\n", "    job_types: [search:index]\n    enqueue_rate_per_key: {limit: 5, per: 1h}\n")
	apptest.ReplaceInConfig(t, cfg, "    max_retry: 2\n", "    max_retry: 2\n    enqueue_rate_per_key: {limit: 20, per: 1h}\n")

	search := `{"product_id":1,"title":"A book","category":"books"}`
	plan := apptest.RepoPath("configs/month-end.yaml")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"job", []string{"job", "-type", "search:index", "-payload", search},
			`enqueue job: pool "search" limits enqueues per caller (enqueue_rate_per_key): name the caller with -rate-key KEY (a requester, a tenant); nothing was enqueued`},
		{"report", []string{"report", "-name", "vat-return", "-period", "2026-10"},
			`enqueue report: pool "batch" limits enqueues per caller (enqueue_rate_per_key): name the caller with -rate-key KEY (a requester, a tenant); nothing was enqueued`},
		{"month-end", []string{"month-end", "-plan", plan, "-period", "2026-10"},
			`enqueue month-end: pool "batch" limits enqueues per caller (enqueue_rate_per_key): name the caller with -rate-key KEY (a requester, a tenant); nothing was enqueued`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := enqueue(t, append([]string{"-config", cfg}, tc.args...)...)
			require.Equal(t, 2, code, stdout+stderr)
			require.Empty(t, stdout)
			require.Equal(t, tc.want+"\n", stderr)
		})
	}
	st := status(t, cfg)
	for _, p := range st.Pools {
		require.Zero(t, p.Backlog, "pool %s", p.Name)
	}

	// With a key they go in; into the order pool, which has no per-caller
	// limit, a job needs none.
	code, _, stderr := enqueue(t, "-config", cfg, "job", "-type", "search:index", "-payload", search, "-rate-key", "tenant-a")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = enqueue(t, "-config", cfg, "month-end", "-plan", plan, "-period", "2026-10", "-rate-key", "tenant-a")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = enqueue(t, "-config", cfg, "job", "-type", "order:create", "-payload", `{"region":"north","category":"books","customer_id":7,"amount_cents":1299}`)
	require.Equal(t, 0, code, stderr)
	st = status(t, cfg)
	require.Equal(t, []int{1, 1, 10}, []int{st.Pools[0].Backlog, st.Pools[1].Backlog, st.Pools[2].Backlog})
}
