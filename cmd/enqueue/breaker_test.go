package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/queues"
)

// An operator opens, closes and resets a pool's breaker; status shows it
// in text and JSON.
func TestBreakerCommand(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, cfg, "    max_retry: 2\n", "    max_retry: 2\n    breaker: {min_calls: 5, cool_down: 10s}\n")

	code, _, stderr := enqueue(t, "-config", cfg, "report", "-name", "vat-return", "-period", "2026-10")
	require.Equal(t, 0, code, stderr)
	code, out, stderr := enqueue(t, "-config", cfg, "breaker", "-pool", "batch")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "breaker of pool batch: closed; window now: 0 calls, 0 failed, 0 slow")

	code, out, stderr = enqueue(t, "-config", cfg, "breaker", "-pool", "batch", "open")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "breaker of pool batch: open (forced open until reset) since ")
	require.Contains(t, out, ": forced open by an operator;")

	st := status(t, cfg)
	var batch *queues.BreakerState
	for _, p := range st.Pools {
		if p.Name == "batch" {
			batch = p.Breaker
			for _, q := range p.Queues {
				if q.Pending > 0 { // asynq reports only queues that exist
					require.True(t, q.Paused, "queue %s paused by the breaker", q.Queue)
				}
			}
		} else {
			require.Nil(t, p.Breaker, "pool %s has no breaker", p.Name)
		}
	}
	require.NotNil(t, batch)
	require.Equal(t, queues.BreakerOpen, batch.State)
	require.Equal(t, queues.BreakerOpen, batch.Forced)
	require.False(t, batch.Since.IsZero())

	code, out, stderr = enqueue(t, "-config", cfg, "status")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `BREAKER\s+STATE\s+SINCE\s+WHY`, out)
	require.Regexp(t, `batch\s+open \(forced\)\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+forced open by an operator`, out)
	require.Contains(t, out, "(paused)")

	code, out, stderr = enqueue(t, "-config", cfg, "breaker", "close", "-pool", "batch", "-json")
	require.Equal(t, 0, code, stderr)
	var closed queues.BreakerState
	require.NoError(t, json.Unmarshal([]byte(out), &closed))
	require.Equal(t, queues.BreakerClosed, closed.State)
	require.Equal(t, queues.BreakerClosed, closed.Forced)
	for _, p := range status(t, cfg).Pools {
		for _, q := range p.Queues {
			require.False(t, q.Paused, "queue %s", q.Queue)
		}
	}

	code, out, stderr = enqueue(t, "-config", cfg, "breaker", "-pool", "batch", "reset")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "closed since ")
	require.Contains(t, out, "reset by an operator")
	require.NotContains(t, out, "forced")

	// Bad input: exit 2, nothing changed.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"breaker", "-pool", "batch", "sideways"}, `the action must be open, close or reset, got "sideways"`},
		{[]string{"breaker", "open"}, "-pool is required"},
		{[]string{"breaker", "-pool", "nope", "open"}, `unknown pool "nope"`},
		{[]string{"breaker", "-pool", "order", "open"}, `pool "order" has no circuit breaker`},
		{[]string{"breaker", "-pool", "batch", "open", "close"}, `unexpected argument "close"`},
	} {
		code, _, stderr = enqueue(t, append([]string{"-config", cfg}, tc.args...)...)
		require.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
	require.Equal(t, queues.BreakerClosed, status(t, cfg).Pools[2].Breaker.State)
}

// Bad breaker settings are config errors, each named, exit 2.
func TestBreakerConfigErrors(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, cfg, "    max_retry: 2\n", "    max_retry: 2\n    breaker: {failure_ratio: 2, cool_down: 10ms, probes: -1, colour: red}\n")
	code, _, stderr := enqueue(t, "-config", cfg, "status")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, `pool "batch": breaker: failure_ratio must be more than 0 and at most 1, got 2`)
	require.Contains(t, stderr, `pool "batch": breaker: cool_down must be >= 1s, got 10ms`)
	require.Contains(t, stderr, `pool "batch": breaker: probes must be >= 1, got -1`)
	require.Contains(t, stderr, "colour")
}
