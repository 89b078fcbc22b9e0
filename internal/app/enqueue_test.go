package app_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/queues"
)

// What a person reads for each outcome of an enqueue: a job the engine
// did not enqueue is never shown as enqueued.
func TestOutcomeText(t *testing.T) {
	t.Parallel()
	for o, want := range map[queues.EnqueueOutcome]string{
		queues.Enqueued:    "enqueued",
		queues.Duplicate:   "already queued or running",
		queues.Replaced:    "enqueued again (the previous run had finished)",
		queues.NotEnqueued: "not enqueued",
	} {
		require.Equal(t, want, app.OutcomeText(o), o.String())
	}
}
