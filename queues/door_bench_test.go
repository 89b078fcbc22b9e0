package queues_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/queues"
)

// BenchmarkEnqueue: one producer's enqueue into a pool without a door and
// into one with every enqueue check (four tiers' backlog limits, two
// rates). The bench's door section reports the ratio under load.
func BenchmarkEnqueue(b *testing.B) {
	tiers := []string{"regulatory", "close", "adhoc"}
	for _, bc := range []struct {
		name string
		pool queues.PoolConfig
	}{
		{"plain", queues.PoolConfig{Tiers: tiers}},
		{"backlog-untiered", queues.PoolConfig{MaxBacklog: 1 << 30}},
		{"backlog-tiers", queues.PoolConfig{Tiers: tiers, MaxBacklog: 1 << 30}},
		{"rate-only", queues.PoolConfig{Tiers: tiers, EnqueueRate: &queues.Rate{Limit: 500000, Per: time.Second}}},
		{"door", queues.PoolConfig{Tiers: tiers, MaxBacklog: 1 << 30, TierLimits: map[string]int{"adhoc": 1 << 29},
			EnqueueRate: &queues.Rate{Limit: 500000, Per: time.Second}, JobTypeRates: map[string]queues.Rate{"x": {Limit: 500000, Per: time.Second}}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := testredis.New(b)
			pc := bc.pool
			pc.Name, pc.Size, pc.JobTypes = "p", 1, []string{"x"}
			c, err := queues.NewClient(r.Client, queues.Config{Namespace: r.Namespace(b), Tiers: testPolicy(b), Logger: slog.New(slog.DiscardHandler), Pools: []queues.PoolConfig{pc}})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ResetTimer()
			for i := range b.N {
				tier := ""
				if pc.Tiers != nil {
					tier = tiers[i%3]
				}
				if _, err := c.Enqueue(ctx, "x", []byte(`{"n":1}`), queues.EnqueueOptions{Tier: tier}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
