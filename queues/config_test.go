package queues_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/priority"
	"github.com/lci-labs/compartment/queues"
)

// unreachable returns a Redis client that nothing listens behind, closed
// when the test ends: NewClient talks to Redis only when asked to.
func unreachable(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func testPolicy(t testing.TB) *priority.Policy {
	t.Helper()
	p, err := priority.New(priority.Config{Tiers: []string{"regulatory", "close", "adhoc"}, Default: "adhoc"})
	require.NoError(t, err)
	return p
}

// WithDefaults fills a copy; the caller's value is never changed.
func TestDefaultsOnACopy(t *testing.T) {
	t.Parallel()
	cfg := queues.Config{Pools: []queues.PoolConfig{{Name: "order", Size: 2, JobTypes: []string{"order:create"}}}}
	d := cfg.WithDefaults()
	require.Equal(t, queues.DefaultNamespace, d.Namespace)
	require.Equal(t, queues.DefaultShutdownTimeout, d.ShutdownTimeout)
	require.NotNil(t, d.Logger)
	p := d.Pools[0]
	require.Equal(t, queues.ScopeCluster, p.Scope, "the default scope is the same in Go and in the config file")
	require.Equal(t, queues.QueueOrderStrict, p.QueueOrder)
	require.Equal(t, queues.DefaultPollInterval, p.PollInterval)
	require.Equal(t, queues.DefaultJobTimeout, p.JobTimeout)
	require.Equal(t, queues.DefaultMaxRetry, p.MaxRetry)

	require.Empty(t, cfg.Namespace, "the caller's config is not changed")
	require.Empty(t, cfg.Pools[0].Scope)
	d.Pools[0].JobTypes[0] = "changed"
	require.Equal(t, "order:create", cfg.Pools[0].JobTypes[0], "the copy shares no slice with the caller's")

	// NewClient applies the defaults the same way, on its own copy.
	c, err := queues.NewClient(unreachable(t), cfg)
	require.NoError(t, err)
	require.Equal(t, queues.DefaultNamespace, c.Namespace())
	require.Equal(t, queues.ScopeCluster, c.Pools()[0].Scope())
	require.Empty(t, cfg.Namespace)
}

func TestNoRetryIsKept(t *testing.T) {
	t.Parallel()
	p := queues.PoolConfig{Name: "a", Size: 1, JobTypes: []string{"x"}, MaxRetry: queues.NoRetry}.WithDefaults()
	require.Equal(t, queues.NoRetry, p.MaxRetry)
}

// TestConfigMistakes: each mistake in a Config built in Go is rejected with
// a message that names the pool, tier or field, and all of them at once.
func TestConfigMistakes(t *testing.T) {
	t.Parallel()
	valid := func() queues.Config {
		return queues.Config{
			Tiers: testPolicy(t),
			Pools: []queues.PoolConfig{
				{Name: "order", Size: 2, JobTypes: []string{"order:create"}},
				{Name: "batch", Size: 1, JobTypes: []string{"report:run"}, Tiers: []string{"regulatory", "adhoc", "close"}},
			},
		}
	}
	require.NoError(t, valid().Validate())
	handlersFor := func(types ...string) *queues.Handlers {
		h := queues.NewHandlers()
		for _, jt := range types {
			h.HandleFunc(jt, noop)
		}
		return h
	}
	cases := []struct {
		name   string
		change func(c *queues.Config)
		want   []string
	}{
		{"no pools", func(c *queues.Config) { c.Pools = nil }, []string{"pools: at least one pool is required"}},
		{"bad namespace", func(c *queues.Config) { c.Namespace = "My Space" }, []string{`namespace: "My Space" must match`}},
		{"duplicate pool names", func(c *queues.Config) { c.Pools[1].Name = "order" }, []string{`pool "order": duplicate pool name`}},
		{"negative size", func(c *queues.Config) { c.Pools[0].Size = -1 }, []string{`pool "order": size must be >= 1, got -1`}},
		{"job type routed to two pools", func(c *queues.Config) { c.Pools[1].JobTypes = append(c.Pools[1].JobTypes, "order:create") },
			[]string{`job type "order:create" is routed to two pools: "order" and "batch"`}},
		{"handler routed to no pool", func(c *queues.Config) { c.Handlers = handlersFor("order:create", "report:run", "search:index") },
			[]string{`job type "search:index" has a handler but is routed to no pool`}},
		{"routed job type without a handler", func(c *queues.Config) { c.Handlers = handlersFor("order:create") },
			[]string{`pool "batch": job type "report:run" has no handler`}},
		{"unknown tier", func(c *queues.Config) { c.Pools[1].Tiers = []string{"regulatory", "adhoc", "urgent"} },
			[]string{`pool "batch": unknown tier "urgent" (the priorities define ["regulatory" "close" "adhoc"])`}},
		{"empty tier list", func(c *queues.Config) { c.Pools[1].Tiers = []string{} },
			[]string{`pool "batch": tiers: the list is empty (omit tiers for a pool with a single queue)`}},
		{"tiers without the default tier", func(c *queues.Config) { c.Pools[1].Tiers = []string{"regulatory", "close"} },
			[]string{`pool "batch": tiers must include the default tier "adhoc"`}},
		{"tiers without a policy", func(c *queues.Config) { c.Tiers = nil }, []string{`pool "batch": tiers need a priority policy`}},
		{"sub-second job timeout", func(c *queues.Config) { c.Pools[1].JobTimeout = 500 * time.Millisecond },
			[]string{`pool "batch": job_timeout must be at least 1s, got 500ms`}},
		{"poll interval too small", func(c *queues.Config) { c.Pools[1].PollInterval = time.Millisecond },
			[]string{`pool "batch": poll_interval must be >= 10ms, got 1ms`}},
		{"negative dequeue loops", func(c *queues.Config) { c.Pools[1].DequeueLoops = -1 },
			[]string{`pool "batch": dequeue_loops must be from 1 to the pool's concurrency in a process (1: max_size, or size for scope: process), got -1`}},
		{"more dequeue loops than workers", func(c *queues.Config) { c.Pools[1].DequeueLoops = 2 },
			[]string{`pool "batch": dequeue_loops must be from 1 to the pool's concurrency in a process (1: max_size, or size for scope: process), got 2`}},
		{"bad scope", func(c *queues.Config) { c.Pools[0].Scope = "global" }, []string{`pool "order": scope must be "cluster" or "process", got "global"`}},
		{"bad queue order", func(c *queues.Config) { c.Pools[1].QueueOrder = "random" },
			[]string{`pool "batch": queue_order must be "strict" or "weighted", got "random"`}},
		{"weighted without all weights", func(c *queues.Config) {
			c.Pools[1].QueueOrder = queues.QueueOrderWeighted
			c.Pools[1].Weights = map[string]int{"regulatory": 3, "adhoc": -1, "bogus": 1}
		}, []string{
			`pool "batch": weights: tier "close" needs a weight`,
			`pool "batch": weights: tier "adhoc" must be >= 1, got -1`,
			`pool "batch": weights: tier "bogus" is not one of the pool's tiers`,
		}},
		{"max retry below NoRetry", func(c *queues.Config) { c.Pools[1].MaxRetry = -2 }, []string{`pool "batch": max_retry must be >= 0, or NoRetry (-1), got -2`}},
		{"every problem at once", func(c *queues.Config) {
			c.Pools[0].Size = 0
			c.Pools[0].JobTimeout = 100 * time.Millisecond
			c.Pools[1].Name = "order"
		}, []string{
			"3 problems:",
			`pool "order": size must be >= 1, got 0`,
			`pool "order": job_timeout must be at least 1s, got 100ms`,
			`pool "order": duplicate pool name`,
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := valid()
			tc.change(&cfg)
			err := cfg.Validate()
			var ce *queues.ConfigError
			require.ErrorAs(t, err, &ce)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
			c, err := queues.NewClient(unreachable(t), cfg)
			require.Nil(t, c, "nothing is built from an invalid config")
			require.ErrorAs(t, err, &ce)
		})
	}
}
