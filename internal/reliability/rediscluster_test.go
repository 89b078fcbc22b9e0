package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/priority"
	"github.com/lci-labs/compartment/queues"
)

// TestRedisClusterSlotsFreedAfterKill is TestClusterSlotsFreedAfterKill on
// a Redis Cluster of 3 masters: three cmd/worker processes configured with
// redis.cluster (the file's key), a month-end plan enqueued by cmd/enqueue
// through REDIS_CLUSTER_ADDRS, the process holding slots of the tiered
// batch pool of 2 killed with SIGKILL. Its slots free within the lease
// time, the others take them, the pool never holds more than 2, every
// report completes, and no process logs a slot error (CROSSSLOT).
func TestRedisClusterSlotsFreedAfterKill(t *testing.T) {
	skipShort(t, "a worker holding cluster-wide slots on a Redis Cluster killed, about 70 s (its jobs come back through asynq's recoverer)")
	t.Parallel() // as TestClusterSlotsFreedAfterKill: nothing here is timed finer than the keeper's 2 s
	rc := testredis.StartCluster(t, 3)
	cfg := apptest.Config(t, rc.Redis(), "")
	body, err := os.ReadFile(cfg)
	require.NoError(t, err)
	text := strings.Replace(string(body), `url: ""`, fmt.Sprintf("cluster:\n    addrs: [%q]", rc.Addrs[0]), 1)
	text = strings.Replace(text, "shutdown_timeout: 5s", "shutdown_timeout: 5s\nreport_min_duration: 6s", 1)
	require.NoError(t, os.WriteFile(cfg, []byte(text), 0o600))
	var ns string
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, "namespace: "); ok {
			ns = v
		}
	}

	var procs []*proc
	workers := map[int]*proc{}
	for range 3 {
		w := start(t, bins.worker, "-config", cfg)
		w.waitServingOn(rc.Client, 3, 60*time.Second)
		workers[w.cmd.Process.Pid] = w
		procs = append(procs, w)
	}
	plan := filepath.Join(apptest.RepoPath("configs"), "month-end.yaml")
	env := []string{"REDIS_CLUSTER_ADDRS=" + strings.Join(rc.Addrs[1:], ",")}
	enq := func(args ...string) (int, string) {
		p := startEnv(t, env, bins.enqueue, append([]string{"-config", cfg}, args...)...)
		procs = append(procs, p)
		return p.wait(60 * time.Second), p.out.String()
	}
	code, out := enq("month-end", "-plan", plan, "-period", "2026-10")
	require.Equal(t, 0, code, out)

	slots := &slotWatch{t: t, rdb: rc.Client, ns: ns, pool: "batch"}
	holders := slots.waitFull(2)
	victim, victimName := slotHolder(t, holders, workers)
	killedAt := time.Now()
	victim.signal(syscall.SIGKILL)
	require.Equal(t, -int(syscall.SIGKILL), victim.wait(10*time.Second))
	replacement := start(t, bins.worker, "-config", cfg)
	procs = append(procs, replacement)

	testwait.For(t, queues.GateLeaseTTL+10*time.Second, "the killed process's slots to be freed", func() bool {
		_, h := slots.read()
		return h[victimName] == 0
	})
	freed := time.Since(killedAt)
	t.Logf("Redis Cluster: slots of the killed process freed %s after SIGKILL (lease %s)", freed.Round(100*time.Millisecond), queues.GateLeaseTTL)
	require.LessOrEqual(t, freed, queues.GateLeaseTTL+5*time.Second)
	testwait.For(t, 30*time.Second, "the other processes to fill the pool again", func() bool {
		n, h := slots.read()
		return n == 2 && h[victimName] == 0
	})

	replacement.waitServingOn(rc.Client, 3, 60*time.Second)
	code, out = enq("status", "-json")
	require.Equal(t, 0, code, out)
	var st app.Status
	require.NoError(t, json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &st))
	batch := st.Pools[2]
	require.Equal(t, "cluster", batch.Scope)
	require.LessOrEqual(t, batch.Active, 2)
	require.NotContains(t, batch.Holders, victimName)

	allDone := every(100*time.Millisecond, func() bool {
		return countStates(jobStates(t, rc.Client, ns))[asynq.TaskStateCompleted] == 10
	})
	testwait.For(t, 4*time.Minute, "every report to complete (the killed process's ones recovered)", func() bool {
		slots.read()
		return allDone()
	})
	t.Logf("Redis Cluster: all 10 reports completed %s after the kill; at most %d slots held at any poll", time.Since(killedAt).Round(time.Second), slots.most)
	require.LessOrEqual(t, slots.most, 2)
	for _, p := range procs {
		for _, line := range strings.Split(p.out.String(), "\n") {
			require.False(t, strings.Contains(line, "CROSSSLOT") || strings.Contains(line, "same slot") || strings.Contains(line, "non local key"),
				"a slot error in the output of %s: %s", filepath.Base(p.cmd.Path), line)
		}
	}
}

// TestRedisClusterThreeProcesses runs three clusterworker processes on a
// Redis Cluster of 3 masters, counting inside their handlers in Redis:
// a tiered pool of 4 never runs more than 4 jobs over 1,500, and a pool
// of 1 starts a mixed backlog strictly by tier; no process logs a slot
// error.
func TestRedisClusterThreeProcesses(t *testing.T) {
	skipShort(t, "1,650 jobs across three worker processes on a Redis Cluster, about 20 s")
	t.Parallel() // counts and start order, recorded inside the handlers; nothing here is timed
	rc := testredis.StartCluster(t, 3)
	tiers := []string{"regulatory", "close", "adhoc"}
	for _, tc := range []struct {
		name  string
		size  int
		total int
		work  time.Duration
	}{{"cap", 4, 1500, 5 * time.Millisecond}, {"tier order", 1, 150, 2 * time.Millisecond}} {
		ns := fmt.Sprintf("rc%d", time.Now().UnixNano()%1e9)
		policy, err := priority.New(priority.Config{Tiers: tiers, Default: tiers[len(tiers)-1]})
		require.NoError(t, err)
		client, err := queues.NewClient(rc.Client, queues.Config{Namespace: ns, Tiers: policy, Pools: []queues.PoolConfig{
			{Name: "batch", Size: tc.size, JobTypes: []string{"report:run"}, Tiers: tiers, Scope: queues.ScopeCluster}}})
		require.NoError(t, err)
		reqs := make([]queues.Request, tc.total)
		for i := range reqs {
			tier := tiers[(i*7)%3]
			payload, _ := json.Marshal(map[string]any{"seq": i, "tier": tier})
			reqs[i] = queues.Request{JobType: "report:run", Payload: payload, Options: queues.EnqueueOptions{Tier: tier, Retention: time.Hour}}
		}
		_, err = client.EnqueueMany(context.Background(), reqs)
		require.NoError(t, err)
		var procs []*proc
		for range 3 {
			p := start(t, bins.clusterworker, "-redis-cluster", strings.Join(rc.Addrs, ","), "-namespace", ns,
				"-size", fmt.Sprint(tc.size), "-tiers", strings.Join(tiers, ","), "-work", tc.work.String())
			p.waitServingOn(rc.Client, 1, 30*time.Second)
			procs = append(procs, p)
		}
		testwait.For(t, 3*time.Minute, tc.name+": every job to complete", every(100*time.Millisecond, func() bool {
			return countStates(jobStates(t, rc.Client, ns))[asynq.TaskStateCompleted] == tc.total
		}))
		obs := "{" + ns + ":obs}:"
		violations, _ := rc.Client.Get(context.Background(), obs+"violations").Int()
		raw, err := rc.Client.LRange(context.Background(), obs+"starts", 0, -1).Result()
		require.NoError(t, err)
		var order []string
		for _, line := range raw {
			f := strings.Fields(line)
			if len(f) == 4 && f[3] == "+" {
				order = append(order, f[2])
			}
		}
		require.Len(t, order, tc.total)
		require.Zero(t, violations, "%s: more than %d jobs ran at once across the processes", tc.name, tc.size)
		inversions := policy.Inversions(order)
		if tc.size == 1 {
			require.Zero(t, inversions, "a lower tier overtook a higher one")
		}
		t.Logf("Redis Cluster, %s: %d jobs on 3 processes, pool of %d: 0 violations, %d tier inversions", tc.name, tc.total, tc.size, inversions)
		for _, p := range procs {
			p.signal(syscall.SIGTERM)
			require.Zero(t, p.wait(30*time.Second))
			require.NotContains(t, p.out.String(), "CROSSSLOT")
			require.NotContains(t, p.out.String(), "same slot")
		}
	}
}
