package app_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/queues"
)

// FuzzConfig feeds arbitrary text to the config loader: it must never panic,
// and whatever it accepts must be a config the engine builds a client from,
// on a Redis client its redis section builds.
func FuzzConfig(f *testing.F) {
	f.Add([]byte(validConfig))
	f.Add([]byte("redis:\n  embedded: true\nreports: CATALOG\npools:\n  - name: a\n    size: 1\n    job_types: [order:create, search:index]\n  - {name: b, size: 1, job_types: [report:run], tiers: [adhoc]}\npriorities: priorities.yaml\n"))
	f.Add([]byte("pools: [{name: a, size: -1, job_types: [x], job_timeout: 500ms}]\n"))
	f.Add([]byte("redis: {url: 'rediss://:pw@h:6380/2'}\npools: [{name: b, size: 2, job_types: [y], queue_order: weighted, weights: {a: 1}}]\n"))
	f.Add([]byte("{{{"))
	f.Add([]byte(withRedis("sentinel: {master: m, addrs: ['127.0.0.1:26379', 'h:26380'], db: 2, tls: true}")))
	f.Add([]byte(withRedis("cluster: {addrs: ['127.0.0.1:7000'], db: 1}")))
	f.Add([]byte(validConfig + "schedules:\n  - {name: m, plan: /dev/null, cron: \"0 2 1 * *\", timezone: Europe/Berlin, period: previous, catch_up: 2h, enabled: false}\n"))
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	f.Cleanup(func() { _ = rdb.Close() })
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := app.Load(writeConfig(t, string(data)), nil)
		if err != nil {
			return
		}
		own, err := cfg.Redis.NewClient()
		if err != nil {
			t.Fatalf("accepted a redis section that builds no client: %v", err)
		}
		_ = own.Close()
		c, err := queues.NewClient(rdb, cfg.Engine)
		if err != nil {
			t.Fatalf("accepted a config the engine refuses: %v", err)
		}
		for _, p := range c.Pools() {
			if p.Size() < 1 || len(p.Queues()) == 0 {
				t.Fatalf("pool %q: size %d, queues %v", p.Name(), p.Size(), p.Queues())
			}
		}
		_ = c.Stop(context.Background())
	})
}
