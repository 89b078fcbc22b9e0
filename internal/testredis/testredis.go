// Package testredis gives tests a Redis: the one named by TEST_REDIS_URL
// when it is set (CI points it at a real server), otherwise an embedded
// in-process Redis (miniredis). Each test gets its own queue namespace, so
// packages can run in parallel against one server, and the test's queues are
// deleted when it ends. DB 0 is refused, so a developer's data is never
// touched.
package testredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// EnvVar names the environment variable with the test Redis URL.
const EnvVar = "TEST_REDIS_URL"

// Redis is a test's Redis connection.
type Redis struct {
	Client redis.UniversalClient
	// Options are the connection options, for code that makes its own client.
	Options *redis.Options
	// URL reaches the same server and DB, for child processes.
	URL string
	// Mini is the embedded server, or nil on a real Redis.
	Mini *miniredis.Miniredis
	// cluster is the Redis Cluster this is, or nil (Cluster.Redis).
	cluster *Cluster
}

// Connect returns a new client of the same Redis, for code that needs a
// client of its own (a "process"): a cluster client on a Redis Cluster.
// The caller closes it.
func (r *Redis) Connect() redis.UniversalClient {
	if r.cluster != nil {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: r.cluster.Addrs})
	}
	return redis.NewClient(r.Options)
}

// New returns a Redis for t and closes it when t ends.
func New(t testing.TB) *Redis {
	t.Helper()
	if raw := os.Getenv(EnvVar); raw != "" {
		opts, err := redis.ParseURL(raw)
		if err != nil {
			t.Fatalf("%s=%q: %v", EnvVar, raw, err)
		}
		if opts.DB == 0 {
			t.Fatalf("%s=%q uses DB 0; tests never touch DB 0: add a DB number, like redis://127.0.0.1:6379/9", EnvVar, raw)
		}
		c := redis.NewClient(opts)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("%s: Redis at %s is unreachable: %v", EnvVar, opts.Addr, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		t.Logf("testredis: real Redis at %s DB %d (%s)", opts.Addr, opts.DB, EnvVar)
		return &Redis{Client: c, Options: opts, URL: raw}
	}
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		t.Fatalf("testredis: start embedded Redis: %v", err)
	}
	opts := &redis.Options{Addr: m.Addr(), DB: 1}
	c := redis.NewClient(opts)
	t.Cleanup(func() {
		_ = c.Close()
		m.Close()
	})
	t.Logf("testredis: embedded Redis (miniredis) at %s; set %s to test against a real one", m.Addr(), EnvVar)
	return &Redis{Client: c, Options: opts, URL: "redis://" + m.Addr() + "/1", Mini: m}
}

// Namespace returns a queue namespace unique to this test run and deletes
// every asynq queue under it when t ends.
func (r *Redis) Namespace(t testing.TB) string {
	t.Helper()
	var b [5]byte
	_, _ = rand.Read(b[:])
	ns := "t" + hex.EncodeToString(b[:])
	if r.cluster == nil { // a test's cluster goes away with the test
		t.Cleanup(func() { r.DeleteQueues(t, ns) })
	}
	return ns
}

// DeleteQueues removes every asynq queue whose name starts with namespace,
// and every key asynq kept for them (its processed/failed counters outlive
// DeleteQueue).
func (r *Redis) DeleteQueues(t testing.TB, namespace string) {
	defer r.deleteKeys(t, namespace+":*") // the runner's own keys (gates, failure counts)
	// asynq's keys of the namespace's queues (queues.NamespaceKeyPatterns; the
	// engine's own tests use this package, so it cannot import the engine).
	defer r.deleteKeys(t, "asynq:{"+namespace+"*")
	insp := asynq.NewInspectorFromRedisClient(r.Client)
	qs, err := insp.Queues()
	if err != nil {
		t.Logf("testredis: list queues: %v", err)
		return
	}
	for _, q := range qs {
		if q == namespace || strings.HasPrefix(q, namespace+":") {
			if err := insp.DeleteQueue(q, true); err != nil {
				t.Logf("testredis: delete queue %s: %v", q, err)
			}
		}
	}
}

func (r *Redis) deleteKeys(t testing.TB, pattern string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := r.Client.Scan(ctx, 0, pattern, 500).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Logf("testredis: scan %s: %v", pattern, err)
		return
	}
	if len(keys) > 0 {
		if err := r.Client.Del(ctx, keys...).Err(); err != nil {
			t.Logf("testredis: delete %d keys: %v", len(keys), err)
		}
	}
}
