package metrics_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/metrics"
	"github.com/lci-labs/compartment/queues"
)

// The dependency and adaptive series show each dependency's capacity, each
// pool's claim on it, and an adaptive pool's limit, which follows an
// operator's resize and reset.
func TestDependencyMetrics(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	c, err := queues.NewClient(r.Client, queues.Config{
		Namespace:    r.Namespace(t),
		Dependencies: []queues.Dependency{{Name: "reports-db", Capacity: 20}},
		Pools: []queues.PoolConfig{
			{Name: "order", Size: 8, MaxSize: 12, JobTypes: []string{"order:create"}, Uses: map[string]int{"reports-db": 1}},
			{Name: "batch", Size: 2, MaxSize: 4, JobTypes: []string{"report:run"}, Uses: map[string]int{"reports-db": 2},
				Adaptive: &queues.AdaptiveConfig{Min: 1}},
		},
	})
	require.NoError(t, err)
	m := metrics.New()
	require.NoError(t, m.Watch(c))
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	get := func(name string, labels ...string) float64 {
		t.Helper()
		fams, text := scrape(t, srv.URL)
		promtoolCheck(t, text)
		v, ok := value(fams, name, labels...)
		require.True(t, ok, "%s %v is served", name, labels)
		if g := v.GetGauge(); g != nil {
			return g.GetValue()
		}
		return v.GetCounter().GetValue()
	}
	require.Equal(t, 20.0, get("compartment_dependency_capacity", "dependency", "reports-db"))
	require.Equal(t, 8.0, get("compartment_dependency_claimed", "dependency", "reports-db", "pool", "order"))
	require.Equal(t, 8.0, get("compartment_dependency_claimed", "dependency", "reports-db", "pool", "batch"), "max_size 4 × 2")
	require.Equal(t, 0.0, get("compartment_dependency_in_use", "dependency", "reports-db", "pool", "batch"))
	require.Equal(t, 1.0, get("compartment_pool_adaptive_min", "pool", "batch"))
	require.Equal(t, 2.0, get("compartment_pool_adaptive_limit", "pool", "batch"), "its configured size, until its first tick")
	require.Equal(t, 0.0, get("compartment_pool_adaptive_changes_total", "pool", "batch"))

	ctx := context.Background()
	require.NoError(t, c.Resize(ctx, "order", 12))
	require.Equal(t, 12.0, get("compartment_dependency_claimed", "dependency", "reports-db", "pool", "order"))
	require.NoError(t, c.Resize(ctx, "batch", 3))
	require.Equal(t, 3.0, get("compartment_pool_size", "pool", "batch"), "the operator's size")
}
