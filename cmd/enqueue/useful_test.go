package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
)

// `enqueue status` says how many worker processes the work can keep busy,
// in its text and in its JSON: none while nothing waits; one for orders
// waiting on a cluster-scoped pool of 3 that one process runs whole.
func TestStatusSaysUsefulWorkers(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	path := apptest.Config(t, r, "")
	code, out, stderr := enqueue(t, "-config", path, "status")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "Worker processes the work can keep busy now: 0 ")
	require.Zero(t, status(t, path).UsefulWorkers)

	for range 5 {
		code, _, stderr := enqueue(t, "-config", path, "job", "-type", "order:create", "-payload", orderPayload)
		require.Equal(t, 0, code, stderr)
	}
	code, out, stderr = enqueue(t, "-config", path, "status")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "Worker processes the work can keep busy now: 1 ")
	st := status(t, path)
	require.Equal(t, 1, st.UsefulWorkers)
	for _, p := range st.Pools {
		want := 0
		if p.Name == "order" {
			want = 1
		}
		require.Equal(t, want, p.UsefulWorkers, p.Name)
	}
}
