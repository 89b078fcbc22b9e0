package bench

import (
	"context"
	"fmt"

	"github.com/lci-labs/compartment/queues"
)

// clusterOverhead drains the overhead section's backlogs on the Redis
// Cluster (o.Cluster) beside the single Redis (o.Redis), in the same run,
// alternating which goes first each round, and reports the median of the
// per-round ratios (cluster / single). On the cluster a tier's queues and
// its pool's keys share one slot, so each pool's Redis work goes to one
// node; the 3-pool rows spread pools over nodes.
func clusterOverhead(ctx context.Context, o *Options, t *Table, n, rounds, concurrency int) error {
	onCluster := *o
	onCluster.Redis = o.Cluster
	cases := []struct {
		label string
		drain func(o *Options) (float64, error)
	}{
		{"raw asynq, 1 queue", func(o *Options) (float64, error) { return drainRaw(ctx, o, 1, concurrency, n) }},
		{"runner, 1 pool, scope process", func(o *Options) (float64, error) {
			return drainRunner(ctx, o, 1, concurrency, n, queues.ScopeProcess, 0)
		}},
		{"runner, 1 pool, scope cluster (the gate)", func(o *Options) (float64, error) {
			return drainRunner(ctx, o, 1, concurrency, n, queues.ScopeCluster, 0)
		}},
		{"runner, 3 pools, scope cluster", func(o *Options) (float64, error) {
			return drainRunner(ctx, o, 3, concurrency, n, queues.ScopeCluster, 0)
		}},
	}
	for _, c := range cases {
		var ratios []float64
		var singleTotal, clusterTotal float64
		for round := 1; round <= rounds; round++ {
			var single, cluster float64
			var err error
			first, second := &single, &cluster
			fo, so := o, &onCluster
			if round%2 == 0 {
				first, second, fo, so = &cluster, &single, &onCluster, o
			}
			if *first, err = c.drain(fo); err != nil {
				return err
			}
			if *second, err = c.drain(so); err != nil {
				return err
			}
			ratios = append(ratios, cluster/single)
			singleTotal += single
			clusterTotal += cluster
			t.row(fmt.Sprintf("Redis Cluster vs single Redis, %s, C=%d", c.label, concurrency), round, fmt.Sprintf("%.0f (single)", single), fmt.Sprintf("%.0f (cluster)", cluster), ratio(cluster, single))
		}
		t.row(fmt.Sprintf("Redis Cluster vs single Redis, %s: all rounds", c.label), "-", fmt.Sprintf("%.0f", singleTotal/float64(rounds)), fmt.Sprintf("%.0f", clusterTotal/float64(rounds)),
			fmt.Sprintf("%.3fx median (per round: %s)", median(ratios), fmtRatios(ratios)))
	}
	t.note("the Redis Cluster rows: the same drains on a Redis Cluster (-redis-cluster-addrs) beside the single Redis, alternating which goes first; a pool's keys share one slot, so one pool's load sits on one node")
	return nil
}
