package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
)

// status shows each tier's reservation and maximum wait, and the oldest
// pending job's wait against it, in text and in JSON.
func TestStatusShowsSteering(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, cfg, "    max_retry: 2\n", "    max_retry: 2\n    reserved: {regulatory: 1}\n    max_wait: {adhoc: 1s, management: 1h}\n")
	code, _, stderr := enqueue(t, "-config", cfg, "report", "-name", "top-customers", "-period", "2026-10", "-tier", "adhoc")
	require.Equal(t, 0, code, stderr)

	byTier := func(st app.Status) map[string]app.QueueStatus {
		m := map[string]app.QueueStatus{}
		for _, q := range st.Pools[2].Queues {
			m[q.Tier] = q
		}
		return m
	}
	// No worker runs: the adhoc report goes past its 1 s limit.
	testwait.For(t, 10*time.Second, "the adhoc report to wait past its limit", func() bool {
		return byTier(status(t, cfg))["adhoc"].OverMaxWait
	})
	q := byTier(status(t, cfg))
	require.Equal(t, 1, q["regulatory"].Reserved)
	require.Zero(t, q["close"].Reserved)
	require.Equal(t, 1.0, q["adhoc"].MaxWaitSeconds)
	require.Equal(t, 3600.0, q["management"].MaxWaitSeconds)
	require.False(t, q["management"].OverMaxWait, "nothing pending in management")

	code, out, stderr := enqueue(t, "-config", cfg, "status")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `STEERING\s+TIER\s+RESERVED\s+MAX WAIT\s+OLDEST WAIT`, out)
	require.Regexp(t, `batch\s+regulatory\s+1\s+-\s+-\n`, out)
	require.Regexp(t, `batch\s+management\s+-\s+1h0m0s\s+-\n`, out)
	require.Regexp(t, `batch\s+adhoc\s+-\s+1s\s+\d+s \(over: served first\)\n`, out)
	_, jsonOut, _ := enqueue(t, "-config", cfg, "status", "-json")
	var raw struct {
		Pools []struct {
			Queues []map[string]any `json:"queues"`
		} `json:"pools"`
	}
	require.NoError(t, json.Unmarshal([]byte(jsonOut), &raw))
	adhoc := raw.Pools[2].Queues[3]
	require.Equal(t, "adhoc", adhoc["tier"])
	require.Equal(t, 1.0, adhoc["max_wait_seconds"])
	require.Equal(t, true, adhoc["over_max_wait"])
}

// Steering on a process-scoped pool is a config error, named, exit 2.
func TestSteeringConfigErrors(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	apptest.ReplaceInConfig(t, cfg, "    max_retry: 2\n", "    max_retry: 2\n    scope: process\n    reserved: {regulatory: 2}\n    max_wait: {regulatory: 1m}\n")
	code, _, stderr := enqueue(t, "-config", cfg, "status")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, `pool "batch": reserved needs scope: cluster`)
	require.Contains(t, stderr, `pool "batch": reserved: 2 slots reserved in all, but the pool's size is 2`)
	require.Contains(t, stderr, `pool "batch": max_wait: tier "regulatory" is the pool's highest tier`)
}
