package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/queues/queuestest"
)

// `enqueue status` shows a job whose worker stopped renewing its lease (a
// worker killed, frozen or cut off), until it is taken back: in its text
// and in its JSON, with how long it has been silent against recover_after.
func TestStatusShowsSilentJobs(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	path := apptest.Config(t, r, "")
	code, _, stderr := enqueue(t, "-config", path, "job", "-type", "order:create", "-payload", orderPayload)
	require.Equal(t, 0, code, stderr)
	code, out, stderr := enqueue(t, "-config", path, "status")
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, out, "Workers not heard from")

	id, undo, err := queuestest.Abandon(context.Background(), r.Client, namespaceOf(t, path), "order", "", 9*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, undo()) })
	code, out, stderr = enqueue(t, "-config", path, "status")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "Workers not heard from")
	require.Contains(t, out, `order: job "`+id+`" of a worker asynq no longer lists, silent `)
	require.Contains(t, out, " of 15s")
	st := status(t, path)
	for _, p := range st.Pools {
		if p.Name != "order" {
			require.Empty(t, p.Silent, p.Name)
			continue
		}
		require.Len(t, p.Silent, 1)
		require.Equal(t, id, p.Silent[0].ID)
		require.InDelta(t, 9, p.Silent[0].SilentSeconds, 2, "silent since its last renewal, in whole seconds")
		require.Equal(t, 15.0, p.Silent[0].RecoverAfterSeconds)
	}
}

// namespaceOf reads the namespace a config written by apptest names.
func namespaceOf(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "namespace: "); ok {
			return v
		}
	}
	t.Fatalf("%s names no namespace", path)
	return ""
}
