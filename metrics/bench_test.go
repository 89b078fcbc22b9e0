package metrics_test

import (
	"testing"
	"time"

	"github.com/lci-labs/compartment/metrics"
	"github.com/lci-labs/compartment/queues"
)

// BenchmarkObserver is what the observer adds to one job: a start and a
// finish, as the runner reports them.
func BenchmarkObserver(b *testing.B) {
	m := metrics.New()
	s := queues.JobStart{Pool: "batch", Tier: "regulatory", JobType: "report:run", JobID: "x", Wait: time.Second, WaitKnown: true}
	e := queues.JobEnd{Pool: "batch", Tier: "regulatory", JobType: "report:run", JobID: "x", Outcome: queues.OutcomeSucceeded, Started: true, Run: time.Millisecond}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.JobStarted(s)
			m.JobFinished(e)
		}
	})
}
