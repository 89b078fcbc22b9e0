package queues_test

import (
	"context"
	"log/slog"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/queues"
)

// BenchmarkEnqueue: one producer's enqueue into a pool without a door and
// into one with every enqueue check (three tiers' backlog limits, two
// rates). The bench's door section reports the ratio under load.
//
// It reports the CPU time per enqueue of this process (cpu-us/op, the
// producer's side) and, on a real Redis, of the Redis server
// (redis-cpu-us/op, from INFO cpu) and Redis's time in scripts
// (script-us/op, EVALSHA from INFO commandstats). CPU times hold up better
// than ns/op on a busy machine. The Redis figures count every client's
// work, so they mean something only on a Redis of one's own:
//
//	redis-server --port 6390 --save '' --appendonly no &
//	TEST_REDIS_URL=redis://127.0.0.1:6390/9 go test -run '^$' -bench Enqueue ./queues
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
			before := redisMicros(ctx, r)
			cpu := cpuMicros()
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
			b.StopTimer()
			b.ReportMetric((cpuMicros()-cpu)/float64(b.N), "cpu-us/op")
			if after := redisMicros(ctx, r); before.ok && after.ok {
				b.ReportMetric((after.cpu-before.cpu)/float64(b.N), "redis-cpu-us/op")
				b.ReportMetric((after.script-before.script)/float64(b.N), "script-us/op")
			}
		})
	}
}

var (
	evalshaMicros = regexp.MustCompile(`cmdstat_evalsha:calls=\d+,usec=(\d+)`)
	redisCPU      = regexp.MustCompile(`used_cpu_(?:sys|user):([0-9.]+)`)
)

// redisTimes is how long a Redis server has spent, in µs: on the CPU, and
// in EVALSHA.
type redisTimes struct {
	cpu, script float64
	ok          bool // false where Redis does not say (the embedded one)
}

func redisMicros(ctx context.Context, r *testredis.Redis) redisTimes {
	if r.Mini != nil {
		return redisTimes{}
	}
	info, err := r.Client.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return redisTimes{}
	}
	t := redisTimes{ok: true}
	for _, m := range redisCPU.FindAllStringSubmatch(info, 2) {
		v, _ := strconv.ParseFloat(m[1], 64)
		t.cpu += v * 1e6
	}
	if m := evalshaMicros.FindStringSubmatch(info); m != nil {
		t.script, _ = strconv.ParseFloat(m[1], 64)
	}
	return t
}

// cpuMicros is the CPU time this process has used, in µs.
func cpuMicros() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e3
}
