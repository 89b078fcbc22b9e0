package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
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

// killRun is worker processes (clusterworker, recording each start with
// its process) on one Redis, some of which a test kills with SIGKILL and
// replaces, as a supervisor would.
type killRun struct {
	t       *testing.T
	r       *ownRedis
	ns      string
	args    []string
	workers map[int]*proc // live ones, by pid
	kills   []kill
}

// kill is one SIGKILL: when, which process, the jobs it had started and
// not finished, and those whose handler had finished but whose outcome
// asynq had not yet written (unacked).
type kill struct {
	at      int64 // µs
	pid     int
	seqs    []int
	unacked []int
}

// run is one start of a job, inside its handler.
type run struct {
	seq, pid int
	at       int64 // µs
}

func (k *killRun) startWorker() {
	p := start(k.t, bins.clusterworker, k.args...)
	p.waitServing(k.r, 1, 30*time.Second)
	k.workers[p.cmd.Process.Pid] = p
	k.t.Cleanup(func() {
		select {
		case <-p.done: // killed
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			p.wait(30 * time.Second)
		}
	})
}

// runs reads every start, in order.
func (k *killRun) runs() []run {
	raw, err := k.r.Client.LRange(context.Background(), k.ns+":obs:pids", 0, -1).Result()
	require.NoError(k.t, err)
	out := make([]run, 0, len(raw))
	for _, line := range raw {
		var x run
		_, err := fmt.Sscanf(line, "%d %d %d", &x.seq, &x.pid, &x.at)
		require.NoError(k.t, err, line)
		out = append(out, x)
	}
	return out
}

// ends reads, per job, when each of its runs ended (µs, in order).
func (k *killRun) ends() map[int][]int64 {
	raw, err := k.r.Client.LRange(context.Background(), k.ns+":obs:starts", 0, -1).Result()
	require.NoError(k.t, err)
	out := map[int][]int64{}
	for _, line := range raw {
		f := strings.Fields(line)
		if f[len(f)-1] != "-" {
			continue
		}
		var at int64
		var seq int
		_, err := fmt.Sscanf(f[0]+" "+f[1], "%d %d", &at, &seq)
		require.NoError(k.t, err, line)
		out[seq] = append(out[seq], at)
	}
	return out
}

// inflight returns, per live process, the jobs it started and has not
// finished.
func (k *killRun) inflight() map[int][]int {
	ends := k.ends()
	out := map[int][]int{}
	for _, x := range k.runs() {
		if _, live := k.workers[x.pid]; !live {
			continue
		}
		if !slices.ContainsFunc(ends[x.seq], func(e int64) bool { return e > x.at }) {
			out[x.pid] = append(out[x.pid], x.seq)
		}
	}
	return out
}

// killBusiest kills the live process running the most jobs (waiting until
// one runs some) and starts a replacement.
func (k *killRun) killBusiest() {
	var pid int
	var seqs []int
	testwait.For(k.t, 60*time.Second, "a worker running jobs", every(50*time.Millisecond, func() bool {
		for p, s := range k.inflight() {
			if len(s) > len(seqs) {
				pid, seqs = p, s
			}
		}
		return pid != 0
	}))
	victim := k.workers[pid]
	at := time.Now().UnixMicro()
	victim.signal(syscall.SIGKILL)
	require.Equal(k.t, -int(syscall.SIGKILL), victim.wait(10*time.Second))
	delete(k.workers, pid)
	// Jobs may have ended, or started, between the look above and the
	// kill: read again now that the process is gone, and keep every job
	// it had started and not ended by the kill (a run CI once saw start
	// in between ran again without being counted).
	ends := k.ends()
	var caught []int
	for _, x := range k.runs() {
		if x.pid == pid && !slices.Contains(caught, x.seq) &&
			!slices.ContainsFunc(ends[x.seq], func(e int64) bool { return e > x.at && e < at }) {
			caught = append(caught, x.seq)
		}
	}
	// A job whose handler had ended but whose outcome asynq had not
	// written yet (the milliseconds between the two) is still active in
	// asynq: it runs again too, as it would with any queue whose worker
	// dies before it acknowledges a job.
	var unacked []int
	states := map[int]asynq.TaskState{}
	for _, ti := range jobStates(k.t, k.r.Client, k.ns) {
		var p struct {
			Seq int `json:"seq"`
		}
		if json.Unmarshal(ti.Payload, &p) == nil {
			states[p.Seq] = ti.State
		}
	}
	for _, x := range k.runs() {
		if x.pid == pid && !slices.Contains(caught, x.seq) && !slices.Contains(unacked, x.seq) &&
			slices.ContainsFunc(ends[x.seq], func(e int64) bool { return e > x.at && e < at }) &&
			states[x.seq] == asynq.TaskStateActive {
			unacked = append(unacked, x.seq)
			k.t.Logf("job %d: its handler ended before the kill of %d, its outcome not yet written: it runs again", x.seq, pid)
		}
	}
	k.kills = append(k.kills, kill{at: at, pid: pid, seqs: caught, unacked: unacked})
	k.startWorker()
}

// logBreakdown logs, for kill kl, when its jobs started again, and when
// the last recovery before the first of those starts (the one that put
// them back, or the first of several) came after the kill, with how long
// the leases had been silent then.
func (k *killRun) logBreakdown(kl kill) {
	var starts []int64
	seqs := slices.Clone(kl.seqs)
	for _, x := range k.runs() {
		if x.at > kl.at && slices.Contains(seqs, x.seq) {
			starts = append(starts, x.at)
			seqs = slices.DeleteFunc(seqs, func(s int) bool { return s == x.seq })
		}
	}
	if len(starts) == 0 {
		return
	}
	raw, err := k.r.Client.LRange(context.Background(), k.ns+":obs:recovered", 0, -1).Result()
	require.NoError(k.t, err)
	var put, silent int64
	for _, line := range raw {
		var at, s int64
		var n int
		_, err := fmt.Sscanf(line, "%d %d %d", &at, &s, &n)
		require.NoError(k.t, err, line)
		if at > kl.at && at <= starts[0] {
			put, silent = at, s
		}
	}
	us := func(d int64) time.Duration { return (time.Duration(d) * time.Microsecond).Round(10 * time.Millisecond) }
	var after []string
	for _, at := range starts {
		after = append(after, us(at-kl.at).String())
	}
	if put == 0 {
		k.t.Logf("kill of %d: started again %v after it, no recovery recorded in between", kl.pid, after)
		return
	}
	k.t.Logf("kill of %d: jobs put back %s after it (leases silent %s), started again %v after the kill",
		kl.pid, us(put-kl.at), us(silent), after)
}

// recoveries returns, for each job a kill caught running, the time from
// the kill to its next start.
func (k *killRun) recoveries() []time.Duration {
	runs := k.runs()
	var out []time.Duration
	for _, kl := range k.kills {
		for _, seq := range kl.seqs {
			i := slices.IndexFunc(runs, func(x run) bool { return x.seq == seq && x.at > kl.at })
			require.GreaterOrEqual(k.t, i, 0, "job %d, killed with process %d, never started again", seq, kl.pid)
			out = append(out, time.Duration(runs[i].at-kl.at)*time.Microsecond)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// mostAtOnce returns the most jobs inside the handlers at once: each run
// lasts from its start to its end, or to its process's kill.
func (k *killRun) mostAtOnce() int {
	ends := k.ends()
	killed := map[int]int64{}
	for _, kl := range k.kills {
		killed[kl.pid] = kl.at
	}
	type edge struct {
		at    int64
		delta int
	}
	var edges []edge
	for _, x := range k.runs() {
		end := int64(1) << 62
		if i := slices.IndexFunc(ends[x.seq], func(e int64) bool { return e > x.at }); i >= 0 {
			end = ends[x.seq][i]
		}
		if kt, ok := killed[x.pid]; ok && kt > x.at && kt < end {
			end = kt
		}
		edges = append(edges, edge{x.at, 1}, edge{end, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at != edges[j].at {
			return edges[i].at < edges[j].at
		}
		return edges[i].delta < edges[j].delta // an end before a start at the same instant
	})
	n, most := 0, 0
	for _, e := range edges {
		n += e.delta
		most = max(most, n)
	}
	return most
}

// explain logs where the given jobs are, for a failure.
func (k *killRun) explain(seqs []int) {
	for _, ti := range jobStates(k.t, k.r.Client, k.ns) {
		var p struct {
			Seq int `json:"seq"`
		}
		_ = json.Unmarshal(ti.Payload, &p)
		if slices.Contains(seqs, p.Seq) {
			k.t.Logf("job %d (%s): state %s, queue %s, retried %d, last error %q", p.Seq, ti.ID, ti.State, ti.Queue, ti.Retried, ti.LastErr)
		}
	}
	ctx := context.Background()
	for _, key := range []string{"asynq:{" + k.ns + ":batch}:lease", k.ns + ":gate:batch:leases", k.ns + ":gate:batch:waiting", k.ns + ":gate:batch:waiting:expiry"} {
		z, _ := k.r.Client.ZRangeWithScores(ctx, key, 0, -1).Result()
		k.t.Logf("%s: %v", key, z)
	}
	for _, key := range []string{"asynq:{" + k.ns + ":batch}:pending", "asynq:{" + k.ns + ":batch}:active"} {
		l, _ := k.r.Client.LRange(ctx, key, -5, -1).Result()
		n, _ := k.r.Client.LLen(ctx, key).Result()
		k.t.Logf("%s (%d, last 5): %v", key, n, l)
	}
	h, _ := k.r.Client.HGetAll(ctx, k.ns+":gate:batch:leases:holders").Result()
	k.t.Logf("holders: %v; paused: %q", h, k.r.Client.Get(ctx, "asynq:{"+k.ns+":batch}:paused").Val())
	k.t.Logf("live workers: %v", slices.Collect(maps.Keys(k.workers)))
}

func percentile(d []time.Duration, p float64) time.Duration {
	return d[int(float64(len(d)-1)*p)]
}

// TestRecoveryAfterKills kills a worker with SIGKILL 20 times during
// month-end style runs (four runs side by side, each three workers with a
// cluster-wide pool of 4 running jobs of 3 s, five kills each, every kill
// replaced as a supervisor would), and measures how long after each kill
// the jobs it was running start again: within recover_after (15 s) and a
// few seconds. Each kill comes once the previous one's jobs run again, so
// that a kill never catches a job still coming back from the last one.
// Beside it, the same harness on plain asynq (three servers of 2 workers,
// two kills): asynq's lease and once-a-minute recoverer take 55 to 125 s.
// Every job completes, a job runs once more per kill that caught it and no
// more, no retry is used up, and the cap holds inside the handlers.
func TestRecoveryAfterKills(t *testing.T) {
	skipShort(t, "20 worker kills with the engine and 2 with plain asynq, about 2 min")
	t.Parallel()
	var mu sync.Mutex
	var engine, plain []time.Duration
	t.Run("engine", func(t *testing.T) {
		t.Parallel()
		for run := range 4 {
			t.Run(fmt.Sprint("run ", run+1), func(t *testing.T) {
				t.Parallel()
				got := killRunEngine(t, 5)
				mu.Lock()
				engine = append(engine, got...)
				mu.Unlock()
			})
		}
	})
	t.Run("plain asynq", func(t *testing.T) {
		t.Parallel()
		const jobs = 40
		r := startRedis(t)
		ns := fmt.Sprintf("pa%d", time.Now().UnixNano()%1e9)
		k := &killRun{t: t, r: r, ns: ns, workers: map[int]*proc{},
			args: []string{"-redis", r.URL, "-namespace", ns, "-size", "2", "-work", "3s", "-record-pid", "-plain"}}
		for range 3 {
			k.startWorker()
		}
		client := asynq.NewClientFromRedisClient(r.Client)
		for i := range jobs {
			payload, _ := json.Marshal(map[string]any{"seq": i})
			_, err := client.Enqueue(asynq.NewTask("report:run", payload), asynq.Queue(ns+":plain"), asynq.MaxRetry(5), asynq.Retention(time.Hour))
			require.NoError(t, err)
		}
		began := time.Now()
		for range 2 {
			k.killBusiest()
			testwait.For(t, 30*time.Second, "the next kill's time", func() bool { return time.Since(began) >= time.Duration(len(k.kills))*4*time.Second })
		}
		testwait.For(t, 5*time.Minute, "every job to complete", every(200*time.Millisecond, func() bool {
			return countStates(jobStates(t, r.Client, ns))[asynq.TaskStateCompleted] == jobs
		}))
		got := k.recoveries()
		mu.Lock()
		plain = got
		mu.Unlock()
		t.Logf("plain asynq: %d killed jobs started again after the kill in p50 %s, max %s",
			len(got), percentile(got, 0.5).Round(100*time.Millisecond), got[len(got)-1].Round(100*time.Millisecond))
	})
	t.Cleanup(func() {
		sort.Slice(engine, func(i, j int) bool { return engine[i] < engine[j] })
		if len(engine) > 0 {
			// Measured p50 about 15 s, max 17.6 s (docs/RELIABILITY.md):
			// recover_after after the last renewal, then at once (its slot is
			// kept for it, and a waiting job gives it a worker). The bound
			// leaves room for a loaded machine and is far under asynq's 55 s
			// floor: a recovery left to asynq fails.
			require.LessOrEqual(t, engine[len(engine)-1], 30*time.Second, "a killed job starts again within 30 s (recover_after 15 s), not asynq's minute")
		}
		if len(engine) > 0 && len(plain) > 0 {
			t.Logf("from kill to start again, %d jobs caught by 20 kills: engine p50 %s max %s; plain asynq p50 %s max %s (%.1fx faster at the median)",
				len(engine), percentile(engine, 0.5).Round(100*time.Millisecond), engine[len(engine)-1].Round(100*time.Millisecond),
				percentile(plain, 0.5).Round(100*time.Millisecond), plain[len(plain)-1].Round(100*time.Millisecond),
				float64(percentile(plain, 0.5))/float64(percentile(engine, 0.5)))
		}
	})
}

// killRunEngine runs three workers with a cluster-wide pool of 4 and kills
// one kills times (see TestRecoveryAfterKills), checks what must hold, and
// returns the time from each kill to each killed job's next start.
func killRunEngine(t *testing.T, kills int) []time.Duration {
	const size, perKill = 4, 20
	c := newClusterRun(t, size, nil)
	k := &killRun{t: t, r: c.r, ns: c.ns, workers: map[int]*proc{},
		args: []string{"-redis", c.r.URL, "-namespace", c.ns, "-size", fmt.Sprint(size), "-work", "3s", "-record-pid"}}
	for range 3 {
		k.startWorker()
	}
	jobs := 0
	more := func(n int) {
		for range n {
			c.enqueue(jobs, "")
			jobs++
		}
	}
	more(perKill)
	for range kills {
		k.killBusiest()
		more(perKill) // keep a backlog: the slots stay busy
		last := k.kills[len(k.kills)-1]
		deadline := time.Now().Add(2 * time.Minute)
		for {
			for _, x := range k.runs() {
				if x.at > last.at {
					last.seqs = slices.DeleteFunc(slices.Clone(last.seqs), func(seq int) bool { return seq == x.seq })
				}
			}
			if len(last.seqs) == 0 {
				k.logBreakdown(k.kills[len(k.kills)-1])
				break
			}
			if time.Now().After(deadline) {
				k.explain(last.seqs)
				t.Fatalf("jobs %v, killed with process %d, did not start again within 2 min", last.seqs, last.pid)
			}
			<-time.After(100 * time.Millisecond) // the next look, within the deadline above
		}
	}
	testwait.For(t, 5*time.Minute, "every job to complete", c.allDone(jobs))
	got := k.recoveries()
	t.Logf("%d killed jobs started again after the kill in p50 %s, max %s (recover_after %s)",
		len(got), percentile(got, 0.5).Round(100*time.Millisecond), got[len(got)-1].Round(100*time.Millisecond), queues.DefaultRecoverAfter)
	require.LessOrEqual(t, k.mostAtOnce(), size, "the cap held inside the handlers")
	starts := map[int]int{}
	for _, x := range k.runs() {
		starts[x.seq]++
	}
	killedRuns, unackedRuns := map[int]int{}, map[int]int{}
	for _, kl := range k.kills {
		for _, seq := range kl.seqs {
			killedRuns[seq]++
		}
		for _, seq := range kl.unacked {
			unackedRuns[seq]++
		}
	}
	ends := k.ends()
	for seq := range jobs {
		require.Len(t, ends[seq], 1+unackedRuns[seq], "job %d finished once (and once more per kill before asynq wrote its outcome)", seq)
		require.Equal(t, 1+killedRuns[seq]+unackedRuns[seq], starts[seq], "job %d ran once more per kill that caught it, no more", seq)
	}
	for _, ti := range jobStates(t, c.r.Client, c.ns) {
		require.Equal(t, asynq.TaskStateCompleted, ti.State, ti.ID)
		require.Zero(t, ti.Retried, "%s: a kill uses up no retry", ti.ID)
	}
	return got
}

const plan2 = "reports:\n  - name: vat-return\n  - name: trial-balance\n"

// stallRun runs a month-end of two reports on worker A alone (the batch
// pool's two slots), starts worker B, stalls A with stall for stallFor,
// resumes it, and checks what the fence promises: B runs the two reports
// again, and A, once it runs again, cancels its runs within about a
// second, publishes no file and records nothing. cfgOf gives A's config
// from B's. With bFirst, B has finished both reports before A resumes:
// their files are then B's, and must stay so.
func stallRun(t *testing.T, pad string, stallFor time.Duration, bFirst bool, cfgOf func(cfg string) string, stall, resume func(a *proc)) {
	r := startRedis(t)
	planFile := filepath.Join(t.TempDir(), "plan.yaml")
	require.NoError(t, os.WriteFile(planFile, []byte(plan2), 0o600))
	cfg, ns := config(t, r, "shutdown_timeout: 5s", "shutdown_timeout: 5s\nreport_min_duration: "+pad)
	a := start(t, bins.worker, "-config", cfgOf(cfg))
	a.waitServing(r, 3, 60*time.Second)
	code, out := enqueue(t, cfg, "month-end", "-plan", planFile, "-period", "2026-10")
	require.Equal(t, 0, code, out)
	waitReportsRunning(t, r, ns, 2)
	dir := outputDir(t, cfg)

	// A stalls at once, while its reports surely run; B starts after. A
	// full CI run once took longer to start B than A's reports (6 s) took
	// to finish, and A, stalled with nothing running, had nothing to lose.
	stall(a)
	stalled := time.Now()
	b := startWorker(t, r, cfg)
	bDone := every(200*time.Millisecond, func() bool {
		return countStates(jobStates(t, r.Client, ns))[asynq.TaskStateCompleted] == 2
	})
	inodes := map[string]uint64{}
	if bFirst {
		testwait.For(t, 60*time.Second, "worker B to run both reports again and finish them", bDone)
		t.Logf("B finished the taken reports %s into the stall", time.Since(stalled).Round(100*time.Millisecond))
		for _, name := range []string{"vat-return", "trial-balance"} {
			fi, err := os.Stat(filepath.Join(dir, name+"_2026-10.csv"))
			require.NoError(t, err, "worker B wrote %s", name)
			inodes[name] = fi.Sys().(*syscall.Stat_t).Ino
		}
	}
	testwait.For(t, stallFor+10*time.Second, "the stall to last its time", func() bool { return time.Since(stalled) >= stallFor })
	// B takes the reports recover_after (15 s) after its own first look at
	// their leases: on a loaded machine B can take longer than stallFor -
	// 15 s to start (a CI run: 8.8 s into a 20 s cut), and A would then
	// reach Redis before anything was taken. The stall lasts until B has
	// taken them.
	b.waitLog("recovered the jobs of a worker process that stopped answering", 60*time.Second)
	resume(a)
	resumed := time.Now()
	a.waitLog("job taken over by another worker process", 10*time.Second)
	learned := time.Since(resumed)
	t.Logf("A learned %s after it could run (and reach Redis) again that its reports were taken", learned.Round(100*time.Millisecond))
	require.Less(t, learned, 3*time.Second, "a resumed worker learns within about a second")
	testwait.For(t, 30*time.Second, "A to let both runs go", func() bool {
		return strings.Count(a.out.String(), `outcome="fenced:`) == 2
	})
	testwait.For(t, 60*time.Second, "worker B to finish both reports", bDone)

	states := jobStates(t, r.Client, ns)
	require.Len(t, states, 2)
	for id, ti := range states {
		require.Equal(t, asynq.TaskStateCompleted, ti.State, id)
		require.Zero(t, ti.Retried, "%s: no retry used", id)
		require.Empty(t, ti.LastErr, "%s: nothing of A's run recorded", id)
		require.Contains(t, lineOf(a.out.String(), "job_id="+id+" "), `outcome="fenced:`, "A's run of %s let go", id)
		require.NotContains(t, lineOf(a.out.String(), "job_id="+id+" "), "outcome=done", "A recorded nothing for %s", id)
		require.Contains(t, lineOf(b.out.String(), "job_id="+id+" "), "outcome=done", "B's run of %s counts", id)
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 2, "the two files, no temporary file of A's runs: %v", entries)
	for name, ino := range inodes {
		fi, err := os.Stat(filepath.Join(dir, name+"_2026-10.csv"))
		require.NoError(t, err)
		require.Equal(t, ino, fi.Sys().(*syscall.Stat_t).Ino, "%s: the file is B's; A renamed nothing over it", name)
	}
}

// lineOf returns the lines of log that contain sub.
func lineOf(log, sub string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestStalledWorkerIsFenced stops a worker running two reports with
// SIGSTOP for 25 s: another worker takes them over and finishes them, and
// the stopped one, continued, cancels its runs within a second, records
// nothing and writes no file over the new ones.
func TestStalledWorkerIsFenced(t *testing.T) {
	skipShort(t, "a worker stopped for 25 s, about 35 s")
	t.Parallel()
	stallRun(t, "6s", 25*time.Second, true, func(cfg string) string { return cfg },
		func(a *proc) { a.signal(syscall.SIGSTOP) }, func(a *proc) { a.signal(syscall.SIGCONT) })
}

// TestPartitionedWorkerIsFenced cuts a worker running two reports off
// from Redis for 20 s (a proxy between them): the other worker takes the
// reports over, and the cut-off one, reaching its reports' end while cut
// off, waits for Redis, then learns they were taken and publishes nothing.
func TestPartitionedWorkerIsFenced(t *testing.T) {
	skipShort(t, "a worker cut off from Redis for 20 s, about 45 s")
	t.Parallel()
	var proxy *dbProxy
	stallRun(t, "18s", 20*time.Second, false, func(cfg string) string {
		data, err := os.ReadFile(cfg)
		require.NoError(t, err)
		url := configURL(t, string(data))
		proxy = startDBProxy(t, strings.Split(url, "/")[2])
		viaProxy := strings.Replace(string(data), url, "redis://"+proxy.l.Addr().String()+"/"+strings.Split(url, "/")[3], 1)
		path := cfg + ".a.yaml"
		require.NoError(t, os.WriteFile(path, []byte(viaProxy), 0o600))
		return path
	}, func(*proc) { proxy.cut() }, func(*proc) { proxy.restore() })
}

// configURL returns the redis url a config written by apptest names.
func configURL(t *testing.T, body string) string {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "url: "); ok {
			return strings.Trim(v, `"`)
		}
	}
	t.Fatal("config names no redis url")
	return ""
}
