package rdb

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/internal/testredis"
)

// BenchmarkGateStep measures what a gate step costs Redis in a full pool
// shared by two processes, run as scripts (EVALSHA, the library set up on
// every call) and as functions (FCALL), one after the other on a Redis of
// its own:
//
//	go test -run '^$' -bench BenchmarkGateStep -benchtime 5000x ./queues/internal/rdb/
//
// Each step is what a process asks when one of its jobs ends and its next
// job is dequeued: it frees its oldest slot, which goes to the longest
// waiter (the other process's), and its new job waits. redis-µs/step is
// Redis's own time inside the call (INFO commandstats), the figure that
// bounds how many jobs one Redis carries; ns/op adds the round trip.
func BenchmarkGateStep(b *testing.B) {
	addr := testredis.StartServer(b)
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	for _, mode := range []string{"scripts", "functions"} {
		b.Run(mode, func(b *testing.B) {
			luaFunctionsOff.Store(mode == "scripts")
			defer luaFunctionsOff.Store(false)
			benchSteps(b, rc, mode)
		})
	}
}

func benchSteps(b *testing.B, rc *redis.Client, mode string) {
	ctx := context.Background()
	be := backend{RC: rc, KS: NewKeyspace(freshNamespace(), false)}
	const size = 10
	gates := [2]*SlotGate{testGate(be, "p1", size, nil), testGate(be, "p2", size, nil)}
	next := 0
	newJob := func() Ask {
		next++
		return ask(be, strconv.Itoa(next), "high", 1)
	}
	for i := range size + 2 { // ten slots held, then one waiter each
		if _, err := gates[i%2].Step(ctx, StepArgs{Asks: []Ask{newJob()}}); err != nil {
			b.Fatal(err)
		}
	}
	// held returns each process's slots, oldest first (by the lease's
	// expiry: renewed at take).
	held := func() [2][]string {
		ms, err := rc.ZRange(ctx, gates[0].Keys().Leases, 0, -1).Result()
		if err != nil {
			b.Fatal(err)
		}
		holders, err := rc.HGetAll(ctx, gates[0].Keys().Holders).Result()
		if err != nil {
			b.Fatal(err)
		}
		var out [2][]string
		for _, m := range ms {
			if holders[m] == "p2" {
				out[1] = append(out[1], m)
			} else {
				out[0] = append(out[0], m)
			}
		}
		return out
	}
	if err := rc.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		p := i % 2
		h := held()[p]
		if len(h) == 0 {
			b.Fatalf("process %d holds no slot", p+1)
		}
		b.StartTimer()
		r, err := gates[p].Step(ctx, StepArgs{Frees: []Free{{Member: h[0]}}, Asks: []Ask{newJob()}})
		if err != nil {
			b.Fatal(err)
		}
		if r.Count != size {
			b.Fatalf("the pool holds %d slots, not %d", r.Count, size)
		}
	}
	b.StopTimer()
	cmd := map[string]string{"scripts": "evalsha", "functions": "fcall"}[mode]
	info, err := rc.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	m := regexp.MustCompile(`cmdstat_` + cmd + `:calls=(\d+),usec=(\d+),`).FindStringSubmatch(info)
	if m == nil {
		b.Fatalf("no %s in INFO commandstats: the gate did not run as %s", cmd, mode)
	}
	calls, _ := strconv.ParseFloat(m[1], 64)
	usec, _ := strconv.ParseFloat(m[2], 64)
	if calls < float64(b.N) {
		b.Fatal(fmt.Sprintf("%v %s calls for %d steps", calls, cmd, b.N))
	}
	b.ReportMetric(usec/calls, "redis-µs/step")
}
