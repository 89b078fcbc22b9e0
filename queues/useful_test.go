package queues_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/queues"
)

// What an autoscaler reads: how many worker processes a pool's work can
// keep busy. A cluster-scoped pool's size caps it however long the
// backlog; a process-scoped pool grows with its backlog; work that cannot
// start now (an open breaker, an operator's pause) asks for nothing more.
func TestUsefulWorkers(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    queues.PoolDemand
		want int64
	}{
		{"nothing to do", queues.PoolDemand{Scope: queues.ScopeProcess, Size: 3, PerProcess: 3}, 0},
		{"process scope: one job wants a process", queues.PoolDemand{Scope: queues.ScopeProcess, Size: 3, PerProcess: 3, Pending: 1}, 1},
		{"process scope: the backlog over the size, rounded up", queues.PoolDemand{Scope: queues.ScopeProcess, Size: 3, PerProcess: 3, Running: 3, Pending: 7}, 4},
		{"cluster scope: the size caps it however long the backlog", queues.PoolDemand{Scope: queues.ScopeCluster, Size: 4, PerProcess: 2, Running: 4, Pending: 400}, 2},
		{"cluster scope: a resize up asks for more processes", queues.PoolDemand{Scope: queues.ScopeCluster, Size: 6, PerProcess: 2, Running: 4, Pending: 400}, 3},
		{"cluster scope: one process runs the whole size", queues.PoolDemand{Scope: queues.ScopeCluster, Size: 4, PerProcess: 8, Running: 4, Pending: 40}, 1},
		{"cluster scope: jobs taken ahead of a slot are ready, not running", queues.PoolDemand{Scope: queues.ScopeCluster, Size: 2, PerProcess: 2, Running: 2, Taken: 2, Pending: 10}, 1},
		{"cluster scope: less work than the size", queues.PoolDemand{Scope: queues.ScopeCluster, Size: 10, PerProcess: 2, Pending: 3}, 2},
		{"cluster scope: jobs still running after a resize down count", queues.PoolDemand{Scope: queues.ScopeCluster, Size: 2, PerProcess: 2, Running: 6, Pending: 10}, 3},
		{"breaker open: pending jobs do not start", queues.PoolDemand{Scope: queues.ScopeProcess, Size: 2, PerProcess: 2, Running: 1, Pending: 50, BreakerOpen: true}, 1},
		{"no process size known", queues.PoolDemand{Scope: queues.ScopeCluster, Size: 2, Pending: 5}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, queues.UsefulWorkers(tc.d))
		})
	}
}
