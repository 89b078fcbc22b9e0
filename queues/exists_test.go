package queues_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/queues"
)

// Exists finds a job by ID in any of its pool's tiers and any state a job
// is kept in, and nothing for an ID never enqueued.
func TestExists(t *testing.T) {
	t.Parallel()
	h := newHarness(t, batchPool(0, nil))
	ctx := context.Background()
	_, err := h.enqueueTier("regulatory", queues.EnqueueOptions{ID: "pending"})
	require.NoError(t, err)
	res, err := h.enqueueTier("adhoc", queues.EnqueueOptions{ID: "archived"})
	require.NoError(t, err)
	require.NoError(t, h.insp.ArchiveTask(res.Queue, "archived"))
	got, err := h.client.Exists(ctx, "report", []string{"pending", "archived", "never"})
	require.NoError(t, err)
	require.Equal(t, []bool{true, true, false}, got)
	_, err = h.client.Exists(ctx, "nope", []string{"x"})
	require.ErrorContains(t, err, `job type "nope" is routed to no pool`)
}
