package app_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/queues"
)

// writeConfig writes a config and a priorities file into a temp dir and
// returns the config's path.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "priorities.yaml"),
		[]byte("tiers: [regulatory, close, adhoc]\ndefault: adhoc\n"), 0o600))
	path := filepath.Join(dir, "worker.yaml")
	body = strings.ReplaceAll(body, "CATALOG", apptest.RepoPath("configs/reports.yaml"))
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

const validConfig = `
redis:
  url: redis://127.0.0.1:6379/3
priorities: priorities.yaml
reports: CATALOG
pools:
  - name: order
    size: 2
    job_types: [order:create]
  - name: search
    size: 1
    job_types: [search:index]
  - name: batch
    size: 1
    job_types: [report:run]
    tiers: [regulatory, adhoc, close]
`

func TestDefaultsAndRoundTrip(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, validConfig)
	cfg, err := app.Load(path, nil)
	require.NoError(t, err)
	require.Equal(t, queues.DefaultNamespace, cfg.Engine.Namespace)
	require.Equal(t, queues.DefaultShutdownTimeout, cfg.Engine.ShutdownTimeout)
	order := cfg.Engine.Pools[0]
	require.Equal(t, queues.ScopeCluster, order.Scope, "the file's default scope is the engine's")
	require.Equal(t, queues.QueueOrderStrict, order.QueueOrder)
	require.Equal(t, queues.DefaultPollInterval, order.PollInterval)
	require.Equal(t, queues.DefaultJobTimeout, order.JobTimeout)
	require.Equal(t, queues.DefaultMaxRetry, order.MaxRetry)
	require.Equal(t, []string{"regulatory", "close", "adhoc"}, cfg.Policy.Tiers())

	// The file as read, written back out, loads to the same config.
	out, err := yaml.Marshal(cfg.File)
	require.NoError(t, err)
	again, err := app.Load(writeConfig(t, string(out)), nil)
	require.NoError(t, err, string(out))
	require.Equal(t, cfg.Engine.Pools, again.Engine.Pools)
	require.Equal(t, cfg.Redis, again.Redis)
	require.Equal(t, cfg.Engine.Namespace, again.Engine.Namespace)
	require.Equal(t, cfg.Policy.Tiers(), again.Policy.Tiers())
}

// max_retry: 0 in the file means never retry; omitted means the default.
func TestMaxRetryZeroMeansNoRetry(t *testing.T) {
	t.Parallel()
	cfg, err := app.Load(writeConfig(t, validConfig+"    max_retry: 0\n"), nil)
	require.NoError(t, err)
	require.Equal(t, queues.NoRetry, cfg.Engine.Pools[2].MaxRetry)
	require.Equal(t, queues.DefaultMaxRetry, cfg.Engine.Pools[0].MaxRetry)
}

func TestRedisURLFromEnvironment(t *testing.T) {
	t.Parallel()
	env := func(k string) string {
		if k == "REDIS_URL" {
			return "rediss://:s3cret@cache.internal:6380/4"
		}
		return ""
	}
	cfg, err := app.Load(writeConfig(t, validConfig), env)
	require.NoError(t, err)
	require.True(t, cfg.RedisURLFromEnv)
	opts, err := cfg.Redis.Options()
	require.NoError(t, err)
	require.Equal(t, "cache.internal:6380", opts.Addr)
	require.Equal(t, 4, opts.DB)
	require.Equal(t, "s3cret", opts.Password)
	require.NotNil(t, opts.TLSConfig, "rediss:// turns TLS on")
	require.Equal(t, "rediss://:***@cache.internal:6380/4", app.RedactURL(cfg.Redis.URL))

	// REDIS_URL also replaces an embedded setting: a real Redis is never
	// swapped for an in-memory one, only the other way round.
	cfg, err = app.Load(writeConfig(t, strings.Replace(validConfig, "url: redis://127.0.0.1:6379/3", "embedded: true", 1)), env)
	require.NoError(t, err)
	require.False(t, cfg.Redis.Embedded)
}

func TestEmbeddedRedisConfig(t *testing.T) {
	t.Parallel()
	cfg, err := app.Load(writeConfig(t, strings.Replace(validConfig, "url: redis://127.0.0.1:6379/3", "embedded: true", 1)), nil)
	require.NoError(t, err)
	require.Equal(t, app.DefaultEmbeddedAddr, cfg.Redis.EmbeddedAddr)
	require.Equal(t, app.DefaultEmbeddedAddr, cfg.Redis.Addr())
}

// TestConfigMistakes checks that each mistake is rejected with a message
// that names the pool, tier or field.
func TestConfigMistakes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		body string
		want []string
	}{
		{"unknown key", validConfig + "workers: 3\n", []string{"line 17: unknown key workers (the keys here are redis, namespace, priorities"}},
		{"unknown pool key", strings.Replace(validConfig, "size: 2", "size: 2\n    concurrency: 2", 1), []string{"line 9: unknown key pools[0].concurrency (the keys here are name, size, max_size, job_types"}},
		{"malformed yaml", "pools: [\n", []string{"yaml:"}},
		{"empty file", "", []string{"the file is empty"}},
		{"no redis", strings.Replace(validConfig, "url: redis://127.0.0.1:6379/3", "", 1),
			[]string{"redis: set url (or the REDIS_URL environment variable), or embedded: true"}},
		{"redis url and embedded", strings.Replace(validConfig, "url: redis://127.0.0.1:6379/3", "url: redis://x:1/2\n  embedded: true", 1),
			[]string{"redis: set either url or embedded: true, not both"}},
		{"bad redis url", strings.Replace(validConfig, "redis://127.0.0.1:6379/3", "http://x", 1), []string{`redis: url http://x: invalid URL scheme: http`}},
		{"embedded on a public address", strings.Replace(validConfig, "url: redis://127.0.0.1:6379/3", "embedded: true\n  embedded_addr: 0.0.0.0:6379", 1),
			[]string{`redis: embedded_addr "0.0.0.0:6379" must be a loopback address`}},
		{"no pools", "redis:\n  embedded: true\nreports: CATALOG\n", []string{"pools: at least one pool is required"}},
		{"duplicate pool names", strings.Replace(validConfig, "name: search", "name: order", 1), []string{`pool "order": duplicate pool name`}},
		{"size zero", strings.Replace(validConfig, "size: 2", "size: 0", 1), []string{`pool "order": size must be >= 1, got 0`}},
		{"negative size", strings.Replace(validConfig, "size: 2", "size: -1", 1), []string{`pool "order": size must be >= 1, got -1`}},
		{"job type routed to two pools", strings.Replace(validConfig, "[report:run]", "[report:run, order:create]", 1),
			[]string{`job type "order:create" is routed to two pools: "order" and "batch"`}},
		{"job type with a handler routed to none", strings.Replace(validConfig, "[search:index]", "[refund:issue]", 1),
			[]string{`job type "search:index" has a handler but is routed to no pool`, `pool "search": job type "refund:issue" has no handler`}},
		{"pool without job types", strings.Replace(validConfig, "job_types: [order:create]", "", 1),
			[]string{`pool "order": job_types must list at least one job type`}},
		{"unknown tier", strings.Replace(validConfig, "[regulatory, adhoc, close]", "[regulatory, adhoc, urgent]", 1),
			[]string{`pool "batch": unknown tier "urgent" (the priorities define ["regulatory" "close" "adhoc"])`}},
		{"empty tier list", strings.Replace(validConfig, "[regulatory, adhoc, close]", "[]", 1),
			[]string{`pool "batch": tiers: the list is empty (omit tiers for a pool with a single queue)`}},
		{"tiers without the default tier", strings.Replace(validConfig, "[regulatory, adhoc, close]", "[regulatory, close]", 1),
			[]string{`pool "batch": tiers must include the default tier "adhoc"`}},
		{"tiers without a priorities file", strings.Replace(validConfig, "priorities: priorities.yaml\n", "", 1),
			[]string{`pool "batch": tiers need a priorities file (set priorities: FILE)`}},
		{"missing priorities file", strings.Replace(validConfig, "priorities: priorities.yaml", "priorities: nope.yaml", 1),
			[]string{"priorities: open ", "nope.yaml: no such file or directory"}},
		{"sub-second job timeout", validConfig + "    job_timeout: 500ms\n",
			[]string{`pool "batch": job_timeout must be at least 1s, got 500ms (asynq stores whole seconds and would silently use its 30m default)`}},
		{"fractional job timeout", validConfig + "    job_timeout: 1500ms\n",
			[]string{`pool "batch": job_timeout must be a whole number of seconds, got 1.5s`}},
		{"poll interval too small", validConfig + "    poll_interval: 1ms\n",
			[]string{`pool "batch": poll_interval must be >= 10ms, got 1ms`}},
		{"bad queue order", validConfig + "    queue_order: random\n",
			[]string{`pool "batch": queue_order must be "strict" or "weighted", got "random"`}},
		{"weights with strict order", validConfig + "    weights: {regulatory: 3}\n",
			[]string{`pool "batch": weights are only used with queue_order: weighted`}},
		{"weighted without all weights", validConfig + "    queue_order: weighted\n    weights: {regulatory: 3, adhoc: 0, bogus: 1}\n",
			[]string{
				`pool "batch": weights: tier "close" needs a weight`,
				`pool "batch": weights: tier "adhoc" must be >= 1, got 0`,
				`pool "batch": weights: tier "bogus" is not one of the pool's tiers`,
			}},
		{"weighted without tiers", strings.Replace(validConfig, "size: 2", "size: 2\n    queue_order: weighted", 1),
			[]string{`pool "order": queue_order: weighted needs tiers`}},
		{"steering mistakes", validConfig + "    scope: process\n    reserved: {regulatory: 1, adhoc: 1}\n    max_wait: {close: 10ms, nightly: 1m}\n",
			[]string{
				`pool "batch": reserved needs scope: cluster`,
				`pool "batch": reserved: tier "adhoc" is the pool's lowest tier`,
				`pool "batch": reserved: 2 slots reserved in all, but the pool's size is 1`,
				`pool "batch": max_wait needs scope: cluster`,
				`pool "batch": max_wait: tier "close" must be at least 1s, got 10ms`,
				`pool "batch": max_wait: tier "nightly" is not one of the pool's tiers`,
			}},
		{"negative max retry", validConfig + "    max_retry: -1\n", []string{`pool "batch": max_retry must be >= 0 (0: never retry), got -1`}},
		{"negative shutdown timeout", validConfig + "shutdown_timeout: -1s\n", []string{"shutdown_timeout: must be >= 0, got -1s"}},
		{"recover_after below 5s", validConfig + "recover_after: 4s\n", []string{"recover_after: must be at least 5s (asynq renews a running job's lease every 5s), got 4s"}},
		{"recover_after not a duration", validConfig + "recover_after: soon\n", []string{"a string where a duration such as 30s or 1m30s was expected"}},
		{"bad pool name", strings.Replace(validConfig, "name: order", "name: Order Pool", 1), []string{`pool "Order Pool": name must match`}},
		{"pool without a name", strings.Replace(validConfig, "name: order", "name: \"\"", 1), []string{"pools[0]: name is required"}},
		{"every problem at once",
			"redis:\n  url: redis://127.0.0.1:6379/3\nreports: CATALOG\npools:\n  - name: a\n    size: 0\n    job_types: [order:create, search:index, report:run]\n    job_timeout: 100ms\n    tiers: [adhoc]\n  - name: a\n    size: 1\n    job_types: [order:create]\n",
			[]string{
				"config ", "5 problems:",
				`pool "a": tiers need a priorities file (set priorities: FILE)`,
				`pool "a": size must be >= 1, got 0`,
				`pool "a": job_timeout must be at least 1s, got 100ms`,
				`pool "a": duplicate pool name`,
				`job type "order:create" is routed to two pools: "a" and "a"`,
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.body)
			cfg, err := app.Load(path, nil)
			require.Nil(t, cfg)
			var ce *queues.ConfigError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, path, ce.Source)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

// TestNumbersForIntegers: a number with a fraction for an integer setting
// is not cut to an integer behind the user's back: each is a problem
// naming its line and key, listed with the others.
func TestNumbersForIntegers(t *testing.T) {
	t.Parallel()
	body := strings.Replace(validConfig, "size: 1\n    job_types: [report:run]", "size: 2.9\n    job_types: [report:run]", 1) +
		"    max_backlog: 10.9\n    max_retry: 1.99\n    enqueue_rate: {limit: 2.7, per: 1s}\n    colour: red\n" +
		"    breaker: {min_calls: 1e3}\ndatabase:\n  max_connections: 30.0\n"
	path := writeConfig(t, body)
	cfg, err := app.Load(path, nil)
	require.Nil(t, cfg)
	var ce *queues.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Len(t, ce.Problems, 7, ce.Problems)
	// With the unknown key, in line order (the keys it lists are the
	// loader's, tested elsewhere).
	require.True(t, strings.HasPrefix(ce.Problems[4], "line 20: unknown key pools[2].colour (the keys here are name, size, "), ce.Problems[4])
	ce.Problems[4] = "(unknown key)"
	require.Equal(t, []string{
		"line 14: pools[2].size: 2.9 is not a whole number",
		"line 17: pools[2].max_backlog: 10.9 is not a whole number",
		"line 18: pools[2].max_retry: 1.99 is not a whole number",
		"line 19: pools[2].enqueue_rate.limit: 2.7 is not a whole number",
		"(unknown key)",
		"line 21: pools[2].breaker.min_calls: 1e3 is not written as an integer (no decimal point or exponent)",
		"line 23: database.max_connections: 30.0 is not written as an integer (no decimal point or exponent)",
	}, ce.Problems)

	// The same numbers written as integers load.
	for _, fix := range [][2]string{{"2.9", "2"}, {"10.9", "10"}, {"1.99", "1"}, {"2.7", "2"}, {"1e3", "1000"}, {"30.0", "30"}, {"    colour: red\n", ""}} {
		body = strings.Replace(body, fix[0], fix[1], 1)
	}
	cfg, err = app.Load(writeConfig(t, body), nil)
	require.NoError(t, err)
	require.Equal(t, 2, cfg.Engine.Pools[2].Size)
	require.Equal(t, 1000, cfg.Engine.Pools[2].Breaker.MinCalls)
}

// TestBreakerWithNoValue: "breaker:" with no value turns the pool's
// breaker on with its defaults, as "breaker: {}" does and as the hint of
// "enqueue breaker" ("add breaker: to it") promises; leaving the key out
// means no breaker.
func TestBreakerWithNoValue(t *testing.T) {
	t.Parallel()
	defaults := &queues.BreakerConfig{
		FailureRatio: queues.DefaultBreakerFailureRatio, MinCalls: queues.DefaultBreakerMinCalls,
		Window: queues.DefaultBreakerWindow, CoolDown: queues.DefaultBreakerCoolDown,
		MaxCoolDown: queues.DefaultBreakerMaxCoolDown, Probes: queues.DefaultBreakerProbes,
	}
	for _, tc := range []struct{ name, extra string }{
		{"no value", "    breaker:\n"},
		{"no value, last in the file", "    breaker:"},
		{"null", "    breaker: null\n"},
		{"tilde", "    breaker: ~\n"},
		{"empty mapping", "    breaker: {}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := app.Load(writeConfig(t, validConfig+tc.extra), nil)
			require.NoError(t, err)
			require.Equal(t, defaults, cfg.Engine.Pools[2].Breaker)
			require.Nil(t, cfg.Engine.Pools[0].Breaker)
			require.Nil(t, cfg.Engine.Pools[1].Breaker)
		})
	}
	t.Run("left out", func(t *testing.T) {
		cfg, err := app.Load(writeConfig(t, validConfig), nil)
		require.NoError(t, err)
		for _, p := range cfg.Engine.Pools {
			require.Nil(t, p.Breaker, p.Name)
		}
	})
}

func TestLoadMissingFile(t *testing.T) {
	t.Parallel()
	_, err := app.Load(filepath.Join(t.TempDir(), "none.yaml"), nil)
	require.ErrorContains(t, err, "no such file or directory")
}

func TestDurationsParse(t *testing.T) {
	t.Parallel()
	cfg, err := app.Load(writeConfig(t, validConfig+"    poll_interval: 250ms\n    job_timeout: 2m\nshutdown_timeout: 45s\n"), nil)
	require.NoError(t, err)
	require.Equal(t, 250*time.Millisecond, cfg.Engine.Pools[2].PollInterval)
	require.Equal(t, 2*time.Minute, cfg.Engine.Pools[2].JobTimeout)
	require.Equal(t, 45*time.Second, cfg.Engine.ShutdownTimeout)
}

// reserved and max_wait reach the engine as written.
func TestSteeringParses(t *testing.T) {
	t.Parallel()
	body := strings.Replace(validConfig, "size: 1\n    job_types: [report:run]", "size: 4\n    job_types: [report:run]", 1) +
		"    reserved: {regulatory: 1}\n    max_wait: {adhoc: 10m, close: 90s}\n"
	cfg, err := app.Load(writeConfig(t, body), nil)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"regulatory": 1}, cfg.Engine.Pools[2].Reserved)
	require.Equal(t, map[string]time.Duration{"adhoc": 10 * time.Minute, "close": 90 * time.Second}, cfg.Engine.Pools[2].MaxWait)
}

// dequeue_loops and delayed_check_interval reach the engine, and the
// engine's bounds on them are reported in the file's words.
func TestDequeueLoopsAndDelayedCheckInterval(t *testing.T) {
	t.Parallel()
	body := strings.Replace(validConfig, "size: 2\n", "size: 2\n    dequeue_loops: 2\n", 1) + "delayed_check_interval: 2s\n"
	cfg, err := app.Load(writeConfig(t, body), nil)
	require.NoError(t, err)
	require.Equal(t, 2, cfg.Engine.Pools[0].DequeueLoops)
	require.Equal(t, queues.DefaultDequeueLoops, cfg.Engine.Pools[1].DequeueLoops)
	require.Equal(t, 2*time.Second, cfg.Engine.DelayedCheckInterval)

	for _, tc := range []struct{ name, body, want string }{
		{"more loops than workers", strings.Replace(validConfig, "size: 2\n", "size: 2\n    dequeue_loops: 3\n", 1),
			`pool "order": dequeue_loops must be from 1 to the pool's concurrency in a process (2: max_size, or size for scope: process), got 3`},
		{"negative loops", strings.Replace(validConfig, "size: 2\n", "size: 2\n    dequeue_loops: -1\n", 1),
			`pool "order": dequeue_loops must be from 1 to the pool's concurrency in a process (2: max_size, or size for scope: process), got -1`},
		{"negative delayed check interval", validConfig + "delayed_check_interval: -1s\n", "delayed_check_interval: must be >= 0, got -1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := app.Load(writeConfig(t, tc.body), nil)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// max_connections: 0 takes the default, like every other field with one.
func TestZeroMeansDefault(t *testing.T) {
	t.Parallel()
	cfg, err := app.Load(writeConfig(t, validConfig+"database:\n  max_connections: 0\n"), nil)
	require.NoError(t, err)
	require.Equal(t, 20, cfg.Database.MaxConnections)
}

// A rediss:// URL to a port that does not speak TLS says that TLS may be
// the cause, not only that a deadline passed.
func TestTLSToAPlainPortSaysSo(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() }) // accept, never answer: a plain port waiting for a command
		}
	}()
	_, err = app.OpenRedis(context.Background(), app.RedisConfig{URL: "rediss://" + l.Addr().String() + "/1"}, false, nil)
	require.ErrorContains(t, err, "(the URL asks for TLS, rediss://: is the server's port a TLS port?)")
}
