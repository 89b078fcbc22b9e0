package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// TestPromoteUnderLoadThreeProcesses: 1,000 promotions race with the
// dequeues of three worker processes (a cluster-wide pool of 4, three
// tiers, 1,000 short jobs). Observed inside the handlers: every job runs
// exactly once (0 lost, 0 duplicated), and from the queue of the tier its
// last successful promotion moved it to (no copy left behind). Redis holds
// exactly one job per ID at the end.
func TestPromoteUnderLoadThreeProcesses(t *testing.T) {
	skipShort(t, "1,000 promotions racing with three worker processes, about 10 s")
	t.Parallel() // outcomes are counted inside the handlers; nothing here is timed
	tiers := []string{"regulatory", "close", "adhoc"}
	c := newClusterRun(t, 4, tiers)
	ctx := context.Background()
	const jobs, promotions, promoters = 1000, 1000, 2

	queueOf := map[string]string{}
	for _, tier := range tiers {
		q, err := c.client.Pools()[0].QueueFor(tier)
		require.NoError(t, err)
		queueOf[tier] = q
	}
	// Half in close, half in adhoc; the workers start on them at once.
	expect := make([]string, jobs) // the queue each job must run from
	for i := range jobs {
		tier := tiers[1+i%2]
		payload, _ := json.Marshal(map[string]any{"seq": i, "tier": tier})
		_, err := c.client.Enqueue(ctx, "report:run", payload, queues.EnqueueOptions{ID: fmt.Sprintf("j%d", i), Tier: tier, Retention: time.Hour})
		require.NoError(t, err)
		expect[i] = queueOf[tier]
	}

	// Each promoter owns the jobs i%promoters == k, so the order of the
	// promotions of one job is known: the last one that moved it decides
	// where it runs. A promoter keeps choosing among its jobs that it has
	// not yet seen running or done, so most promotions meet a waiting job,
	// many of them near the head of a queue as a worker dequeues it.
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for k := range promoters {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(k), 7))
			var mine []int
			for i := k; i < jobs; i += promoters {
				mine = append(mine, i)
			}
			<-start
			for range promotions / promoters {
				if len(mine) == 0 {
					mine = []int{k} // all ran: keep promoting a finished one
				}
				// Half the time one of its eight oldest, the likeliest to
				// be dequeued at this very moment.
				n := rng.IntN(len(mine))
				if rng.IntN(2) == 0 {
					n = rng.IntN(min(len(mine), 8))
				}
				i := mine[n]
				to := tiers[rng.IntN(len(tiers))]
				res, err := c.client.Promote(ctx, "report:run", fmt.Sprintf("j%d", i), to)
				if err != nil {
					t.Errorf("promote j%d to %s: %v", i, to, err)
					return
				}
				outcome := res.State
				switch {
				case res.Moved:
					outcome = "moved"
					mu.Lock()
					expect[i] = res.Queue
					mu.Unlock()
				case res.Waiting():
					outcome = "already there"
				default:
					mine = append(mine[:n], mine[n+1:]...)
				}
				mu.Lock()
				counts[outcome]++
				mu.Unlock()
			}
		})
	}
	c.start(3, strings.Join(tiers, ","), time.Millisecond, "-record-queue")
	began := time.Now()
	close(start)
	wg.Wait()
	t.Logf("promotions took %s", time.Since(began).Round(time.Millisecond))
	testwait.For(t, 2*time.Minute, "every job to complete", c.allDone(jobs))

	// Inside the handlers: one start per job, from the expected queue.
	raw, err := c.r.Client.LRange(ctx, c.ns+":obs:queues", 0, -1).Result()
	require.NoError(t, err)
	ran := make([][]string, jobs)
	for _, line := range raw {
		var seq int
		var q string
		_, err := fmt.Sscanf(line, "%d %s", &seq, &q)
		require.NoError(t, err, line)
		ran[seq] = append(ran[seq], q)
	}
	lost, dup, wrong := 0, 0, 0
	for i, qs := range ran {
		switch {
		case len(qs) == 0:
			lost++
		case len(qs) > 1:
			dup++
		case qs[0] != expect[i]:
			wrong++
			t.Errorf("job %d ran from %s, but its last promotion moved it to %s", i, qs[0], expect[i])
		}
	}
	require.Zero(t, lost, "jobs that never ran")
	require.Zero(t, dup, "jobs that ran more than once")
	require.Zero(t, wrong)
	require.Zero(t, c.violations(), "more than 4 jobs ran at once across the processes")

	// In Redis: one task per ID, completed, in the queue it ran from.
	insp := asynq.NewInspectorFromRedisClient(c.r.Client)
	seen := map[string]string{}
	for _, q := range queueOf {
		done, err := insp.ListCompletedTasks(q, asynq.PageSize(2*jobs))
		require.NoError(t, err)
		for _, ti := range done {
			require.NotContains(t, seen, ti.ID, "job %s is in %s and %s", ti.ID, seen[ti.ID], q)
			seen[ti.ID] = q
			require.Zero(t, ti.Retried, "no job was put back or retried: %s", ti.ID)
		}
	}
	require.Len(t, seen, jobs)
	require.Equal(t, promotions, counts["moved"]+counts["already there"]+counts["active"]+counts["completed"], "every promotion had one of these outcomes: %v", counts)
	require.Positive(t, counts["moved"], "%v", counts)
	require.Positive(t, counts["active"]+counts["completed"], "some promotions met a job a worker had taken: %v", counts)
	t.Logf("%d promotions racing with 3 processes over %d jobs: %v; 0 lost, 0 duplicated, 0 run from a stale queue", promotions, jobs, counts)
}
