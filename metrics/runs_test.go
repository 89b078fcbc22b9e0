package metrics_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/metrics"
	"github.com/lci-labs/compartment/queues"
)

// compartment_runs counts the recent runs by state: every state's series
// is there at zero before the first run; a run whose jobs wait in their
// queue (no worker runs) counts as running, one cancelled as cancelled.
func TestRunsMetric(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	c, err := queues.NewClient(r.Client, queues.Config{
		Namespace: r.Namespace(t),
		Pools:     []queues.PoolConfig{{Name: "batch", Size: 2, JobTypes: []string{"report:run"}}},
	})
	require.NoError(t, err)
	m := metrics.New()
	require.NoError(t, m.Watch(c))
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	states := []string{queues.RunOpen, queues.RunRunning, queues.RunCancelling, queues.RunSucceeded, queues.RunFailed, queues.RunCancelled, queues.RunRefused}
	counts := func() map[string]float64 {
		t.Helper()
		fams, text := scrape(t, srv.URL)
		require.Contains(t, text, "# HELP compartment_runs ")
		out := map[string]float64{}
		for _, s := range states {
			got, ok := value(fams, "compartment_runs", "state", s)
			require.True(t, ok, "the series of state %s is served", s)
			out[s] = got.GetGauge().GetValue()
		}
		require.Len(t, fams["compartment_runs"].GetMetric(), len(states), "one series per state, no other")
		promtoolCheck(t, text)
		return out
	}
	require.Equal(t, map[string]float64{"open": 0, "running": 0, "cancelling": 0, "succeeded": 0, "failed": 0, "cancelled": 0, "refused": 0}, counts())

	ctx := context.Background()
	start := func(id string, jobs int) {
		t.Helper()
		reqs := make([]queues.Request, jobs)
		for i := range reqs {
			reqs[i] = queues.Request{JobType: "report:run", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i)), Options: queues.EnqueueOptions{ID: fmt.Sprintf("%s-%d", id, i)}}
		}
		_, _, err := c.EnqueueRun(ctx, queues.RunOptions{ID: id, Kind: "month-end", Period: "2026-10"}, reqs)
		require.NoError(t, err)
	}
	start("oct-waiting", 3)
	start("oct-cancelled", 2)
	_, err = c.CancelRun(ctx, "oct-cancelled")
	require.NoError(t, err)
	for id, want := range map[string]string{"oct-waiting": queues.RunRunning, "oct-cancelled": queues.RunCancelled} {
		info, err := c.Run(ctx, id)
		require.NoError(t, err)
		require.Equal(t, want, info.State, "run %s", id)
	}
	require.Equal(t, map[string]float64{"open": 0, "running": 1, "cancelling": 0, "succeeded": 0, "failed": 0, "cancelled": 1, "refused": 0}, counts())
}
