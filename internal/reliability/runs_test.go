package reliability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// runKillPoints are where the worker that finishes a run's last report is
// killed, one per repetition in turn (clusterworker -kill-point):
// "handler", after the report's work and before its handler returns (the
// end is not recorded; the report runs again on another worker, whose end
// settles the run: about 15 s later, once the killed worker's cluster-wide
// slot lease, queues.GateLeaseTTL, has lapsed, since a job is taken back
// only then); "finished", in the observer's JobFinished, after the
// engine recorded the end and, when it settled the run, enqueued the step,
// and before asynq's own write of the outcome (the report is taken back
// and not run again: its record says it succeeded); "due", after the end's
// script answered that the step is due and before the process enqueues it,
// which leaves the step to the other workers' keeper (every 2 s).
var runKillPoints = []string{"handler", "finished", "due"}

// runKill is one repetition's kill and what came of it.
type runKill struct {
	point  string
	pid    int
	worker int           // 1 to 3, in start order
	job    string        // the report the killed worker was finishing
	toStep time.Duration // from the kill to the step's first start (negative: it started before)
	// stepCut: the step's first run was in the killed worker, cut by the
	// kill, and it ran again elsewhere.
	stepCut bool
	took    time.Duration // the repetition, from its workers' start to its checks
}

// TestRunCompletionExactlyOnceUnderKill runs 20 times a run of 40 reports
// with a completion step on three worker processes (a cluster-wide pool
// of 4, reports of 30 ms), and each time kills with SIGKILL the worker
// finishing the last report, at that moment (runKillPoints, in turn).
// Each time, the step's job exists exactly once in asynq, under its fixed
// ID, its handler runs exactly once (or, when the kill caught the step
// itself running in the killed worker, once more elsewhere, as any job
// killed under its worker), the run says 40 succeeded and none queued or
// running, and every report completes in asynq, none run again once its
// end was recorded.
func TestRunCompletionExactlyOnceUnderKill(t *testing.T) {
	skipShort(t, "20 runs whose last report's worker is killed, about 1 min")
	// Not in parallel with the package's other tests: its twelve worker
	// processes at once would load the machine under the tests that
	// judge times (the recovery and shutdown tests), which flaked beside
	// it on a loaded CI run. Alone, it runs first, in about a minute.
	// Four repetitions at once, each with three workers and a namespace of
	// its own on one Redis: a repetition waits 5 to 15 s for the killed
	// worker's report to be taken back (recover_after, or its slot lease),
	// so 20 in a row would take over 3 min; four at once take about 1.
	const reps, atOnce = 20, 4
	r := startRedis(t)
	began := time.Now()
	var mu sync.Mutex
	var kills []runKill
	next := make(chan int)
	var wg sync.WaitGroup
	for range atOnce {
		wg.Go(func() {
			for rep := range next {
				point := runKillPoints[rep%len(runKillPoints)]
				t.Run(fmt.Sprintf("rep %02d %s", rep+1, point), func(t *testing.T) {
					k := runKillRep(t, r, rep+1, point)
					mu.Lock()
					kills = append(kills, k)
					mu.Unlock()
				})
			}
		})
	}
	for rep := range reps {
		next <- rep
	}
	close(next)
	wg.Wait()
	if t.Failed() {
		return
	}
	require.Len(t, kills, reps)
	for _, point := range runKillPoints {
		var d []time.Duration
		for _, k := range kills {
			if k.point == point {
				d = append(d, k.toStep)
			}
		}
		slices.Sort(d)
		t.Logf("kill point %s: %d repetitions, from the kill to the step's start min %s, median %s, max %s",
			point, len(d), d[0].Round(time.Millisecond), d[len(d)/2].Round(time.Millisecond), d[len(d)-1].Round(time.Millisecond))
	}
	cut := 0
	for _, k := range kills {
		if k.stepCut {
			cut++
		}
	}
	t.Logf("%d repetitions, %d at once, in %s; the step itself cut by the kill and run again: %d times",
		reps, atOnce, time.Since(began).Round(100*time.Millisecond), cut)
}

// runKillRep runs one repetition: three workers in a namespace of their
// own, a run of 40 reports whose last one's worker kills itself at point,
// then the checks.
func runKillRep(t *testing.T, r *ownRedis, rep int, point string) runKill {
	const reports, size = 40, 4
	const stepType = "run:done"
	ctx := context.Background()
	began := time.Now()
	ns := fmt.Sprintf("rk%02d%09d", rep, time.Now().UnixNano()%1e9)
	runID := fmt.Sprintf("month-end-%02d", rep)
	stepID := "run:" + runID + ":on_complete"
	client, err := queues.NewClient(r.Client, queues.Config{Namespace: ns, Pools: []queues.PoolConfig{
		{Name: "batch", Size: size, JobTypes: []string{"report:run", stepType}, Scope: queues.ScopeCluster},
	}})
	require.NoError(t, err)

	// recover_after at its least (5 s), as the engine's own recovery tests
	// use it: a report whose worker was killed is taken back 5 s later, or
	// once its slot lease lapsed (15 s) if the worker still held the slot.
	// An idle worker looks for work every 100 ms, not 10: the twelve of
	// four repetitions wait idle most of the time, for a report to be taken
	// back, and at 10 ms they would take most of a core from the tests
	// running beside this one.
	args := []string{"-redis", r.URL, "-namespace", ns, "-size", fmt.Sprint(size), "-work", "30ms", "-record-pid", "-poll-interval", "100ms",
		"-recover-after", queues.MinRecoverAfter.String(), "-run-step", stepType, "-kill-at", fmt.Sprint(reports), "-kill-point", point}
	workers := make([]*proc, 3)
	for i := range workers {
		workers[i] = start(t, bins.clusterworker, args...)
		p := workers[i]
		t.Cleanup(func() {
			select {
			case <-p.done: // killed
			default:
				_ = p.cmd.Process.Signal(syscall.SIGTERM)
				p.wait(30 * time.Second)
			}
		})
	}
	for _, w := range workers {
		w.waitServing(r, 1, 30*time.Second)
	}

	// The run is enqueued and sealed while its queue is paused (an
	// operator's pause, which the workers leave alone): its last end is
	// then always a worker's. (On a loaded machine all 40 reports could
	// end before the Seal, which would then settle the run in this
	// process, and no worker would see the step become due.)
	queue := queues.QueueName(ns, "batch", "")
	insp := asynq.NewInspectorFromRedisClient(r.Client)
	require.NoError(t, insp.PauseQueue(queue))
	reqs := make([]queues.Request, reports)
	for i := range reqs {
		payload, _ := json.Marshal(map[string]any{"seq": i})
		reqs[i] = queues.Request{JobType: "report:run", Payload: payload, Options: queues.EnqueueOptions{ID: fmt.Sprintf("r%02d", i), Retention: time.Hour}}
	}
	_, res, err := client.EnqueueRun(ctx, queues.RunOptions{ID: runID, Kind: "month-end", Period: "2026-10", StartedBy: t.Name(),
		OnComplete: &queues.RunStep{JobType: stepType, Payload: json.RawMessage(`{"note":"month-end closed"}`)}}, reqs)
	require.NoError(t, err)
	for _, x := range res {
		require.Equal(t, queues.Enqueued, x.Outcome, x.ID)
	}
	require.NoError(t, insp.UnpauseQueue(queue))

	// The kill: its record, then the process gone with SIGKILL.
	var kill []string
	testwait.For(t, 60*time.Second, "the worker finishing the last report to kill itself", every(20*time.Millisecond, func() bool {
		raw, err := r.Client.LRange(ctx, ns+":obs:kills", 0, -1).Result()
		require.NoError(t, err)
		if len(raw) > 0 {
			kill = strings.Fields(raw[0])
		}
		return kill != nil
	}))
	require.Len(t, kill, 4, "kill record %q", kill)
	var killedAt int64
	var pid int
	_, err = fmt.Sscan(kill[0]+" "+kill[1], &killedAt, &pid)
	require.NoError(t, err)
	require.Equal(t, point, kill[2])
	k := runKill{point: point, job: kill[3]}
	for i, w := range workers {
		if w.cmd.Process.Pid == pid {
			k.pid, k.worker = pid, i+1
			require.Equal(t, -int(syscall.SIGKILL), w.wait(10*time.Second), "worker %d was killed", i+1)
		}
	}
	require.NotZero(t, k.worker, "the killed process %d is one of the workers", pid)
	t.Logf("kill %s: worker %d (pid %d) killed itself finishing %s", point, k.worker, pid, k.job)

	// The end: the run ended with its step enqueued, the step ran, and
	// every job (40 reports and the step) completed in asynq; the report
	// the killed worker held among them, taken back recover_after later.
	pool, err := client.Pool("batch")
	require.NoError(t, err)
	var info queues.RunInfo
	testwait.For(t, 90*time.Second, "the run to end, its step to run and every job to complete", every(100*time.Millisecond, func() bool {
		info, err = client.Run(ctx, runID)
		require.NoError(t, err)
		if !info.Finished() || info.Due != "" || r.Client.LLen(ctx, ns+":obs:steps").Val() == 0 {
			return false
		}
		completed, other := 0, 0
		for _, q := range pool.Queues() {
			qi, err := insp.GetQueueInfo(q)
			require.NoError(t, err)
			completed += qi.Completed
			other += qi.Pending + qi.Active + qi.Scheduled + qi.Retry + qi.Archived
		}
		return completed == reports+1 && other == 0
	}))

	require.EqualValues(t, 1, r.Client.LLen(ctx, ns+":obs:kills").Val(), "one worker killed itself")

	// The run's record.
	require.Equal(t, queues.RunSucceeded, info.State)
	require.Equal(t, queues.RunCounts{Succeeded: reports}, info.RunCounts, "40 succeeded, none queued or running")
	require.Equal(t, "complete", info.Fired)
	require.Empty(t, info.Due)

	// The step's job, once in asynq, under its fixed ID, in any queue of
	// the namespace and any state.
	queueNames, err := insp.Queues()
	require.NoError(t, err)
	var held []*asynq.TaskInfo
	for _, q := range queueNames {
		if !strings.HasPrefix(q, ns+":") {
			continue
		}
		ti, err := insp.GetTaskInfo(q, stepID)
		if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
			continue
		}
		require.NoError(t, err)
		held = append(held, ti)
	}
	require.Len(t, held, 1, "asynq holds the step's job %s exactly once", stepID)
	require.Equal(t, asynq.TaskStateCompleted, held[0].State)
	states := allJobStates(t, r.Client, ns)
	require.Len(t, states, reports+1, "the 40 reports and the step")
	require.Equal(t, reports+1, countStates(states)[asynq.TaskStateCompleted], "every job completed")
	for id, ti := range states {
		if id != stepID {
			require.Regexp(t, `^r\d\d$`, id, "no job but the 40 reports and the step")
			require.Zero(t, ti.Retried, "%s: a kill uses up no retry", id)
		}
	}

	// The step's handler: once. The "finished" kill can also catch the
	// step itself running in the killed worker: the worker that enqueued
	// it may have taken it at once, and busy CPUs leave the kill a few
	// milliseconds late. That run is cut, and the step, still the one job
	// asynq holds (checked above), runs again once taken back, as any job
	// a worker is killed under: its handler ran in the killed worker and
	// once elsewhere. That is said, and is not a second step; a second
	// step would have run twice outside the killed worker.
	raw, err := r.Client.LRange(ctx, ns+":obs:steps", 0, -1).Result()
	require.NoError(t, err)
	type stepRun struct {
		at       int64
		pid      int
		job, run string
	}
	var steps []stepRun
	for _, line := range raw {
		var s stepRun
		_, err := fmt.Sscanf(line, "%d %d %s %s", &s.at, &s.pid, &s.job, &s.run)
		require.NoError(t, err, line)
		require.Equal(t, stepID, s.job, "the step's job has its fixed ID")
		require.Equal(t, runID, s.run, "the step's payload carries its run")
		steps = append(steps, s)
	}
	require.NotEmpty(t, steps)
	first := steps[0]
	if len(steps) == 2 && steps[0].pid == pid && steps[1].pid != pid {
		k.stepCut = true
		steps = steps[1:]
	}
	require.Len(t, steps, 1, "the step's handler ran exactly once (the killed worker was pid %d): %v", pid, raw)
	k.toStep = time.Duration(first.at-killedAt) * time.Microsecond
	workerOf := func(pid int) int {
		return slices.IndexFunc(workers, func(w *proc) bool { return w.cmd.Process.Pid == pid }) + 1
	}
	stepOn := fmt.Sprintf("worker %d", workerOf(first.pid))
	if k.stepCut {
		stepOn += fmt.Sprintf(", the killed one, cut by the kill; again %s after the kill on worker %d",
			(time.Duration(steps[0].at-killedAt) * time.Microsecond).Round(time.Millisecond), workerOf(steps[0].pid))
	}

	// The reports: each ran, and none ran again once its end was
	// recorded: with the "handler" kill, the report being finished ran
	// again (its end was not recorded), with any other the killed worker
	// had not recorded yet; with the "finished" kill, none.
	starts := map[int][]int{} // seq -> pids, in order
	for _, x := range (&killRun{t: t, r: r, ns: ns}).runs() {
		starts[x.seq] = append(starts[x.seq], x.pid)
	}
	var again []string
	for seq := range reports {
		pids := starts[seq]
		require.NotEmpty(t, pids, "report %d ran", seq)
		require.LessOrEqual(t, len(pids), 2, "report %d ran at most twice: %v", seq, pids)
		if len(pids) == 2 {
			require.Equal(t, pid, pids[0], "report %d ran again only after the kill of the worker running it", seq)
			again = append(again, fmt.Sprintf("r%02d", seq))
		}
	}
	switch point {
	case "handler":
		require.Contains(t, again, k.job, "the report being finished at the kill ran again")
	case "finished", "due":
		require.Empty(t, again, "a report whose end was recorded is not run again")
	}

	// Recovery, for the log: the jobs put back after the kill, and when.
	var putBack []string
	recov, err := r.Client.LRange(ctx, ns+":obs:recovered", 0, -1).Result()
	require.NoError(t, err)
	for _, line := range recov {
		var at, silent int64
		var n int
		_, err := fmt.Sscanf(line, "%d %d %d", &at, &silent, &n)
		require.NoError(t, err, line)
		if at > killedAt {
			putBack = append(putBack, fmt.Sprintf("%d at %s", n, (time.Duration(at-killedAt)*time.Microsecond).Round(10*time.Millisecond)))
		}
	}
	k.took = time.Since(began)
	t.Logf("kill %s: worker %d (pid %d) finishing %s; the step started %s after the kill on %s; reports run again: %v; jobs put back after the kill: %v; repetition took %s",
		point, k.worker, pid, k.job, k.toStep.Round(time.Millisecond), stepOn, again, putBack, k.took.Round(100*time.Millisecond))
	return k
}
