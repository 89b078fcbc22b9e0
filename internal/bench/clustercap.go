package bench

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/pprof"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/queues"
)

// runClusterCap measures a cluster-wide cap at full speed: a backlog of
// short jobs drained by raw asynq in one process, by raw asynq in three
// processes with a static split of the same ten workers (4/3/3), and by a
// pool of size 10 with scope: cluster on three processes, round by round
// in alternating order; then one process with the cluster scope against
// the process scope, and one pool of size 20 with several dequeue loops
// against one raw asynq server of concurrency 20.
//
// A "process" here is a runner (or a raw asynq server) with its own Redis
// client and connection pool, all in this one bench process, as the door
// section's start-rate row does: the three share this process's CPU and
// its scheduler, but every call to Redis, every pause flag and every slot
// goes through Redis as it would from three machines. Every job records
// when it started and ended inside its handler, on this process's one
// monotonic clock, which is what makes slot utilisation measurable across
// the three.
func runClusterCap(ctx context.Context, o *Options) (*Table, error) {
	t := &Table{Header: []string{"setup", "jobs", "jobs/s per round", "ratio per round (median)", "round trips/job", "commands/job", "CPU µs/job: Redis, workers", "busy slots / cap", "max running"}}
	rounds := o.n(3, 1)
	noop, short := o.n(20000, 600), o.n(4000, 200)
	const work = 2 * time.Millisecond
	for _, w := range []struct {
		label string
		work  time.Duration
		jobs  int
	}{{"no-op jobs", 0, noop}, {"2 ms jobs", work, short}} {
		setups := []capSetup{
			{label: "raw asynq, 1 process, C=10", raw: []int{10}},
			{label: "raw asynq, 3 processes, static split 4/3/3", raw: []int{4, 3, 3}},
			{label: "pool size 10, scope: cluster, 3 processes", procs: 3, size: 10, scope: queues.ScopeCluster},
		}
		res, err := capRounds(ctx, o, setups, w.work, w.jobs, rounds)
		if err != nil {
			return nil, err
		}
		ours, raw1, split := res[2], res[0], res[1]
		vsRaw, vsSplit := perRound(ours, raw1), perRound(ours, split)
		for i, s := range setups {
			ratioCell := "-"
			switch i {
			case 1:
				r := perRound(split, raw1)
				ratioCell = fmt.Sprintf("%.2fx raw 1 process (%s)", median(r), fmtRatios(r))
			case 2:
				ratioCell = fmt.Sprintf("%.2fx raw 1 process (%s); %.2fx static split (%s)", median(vsRaw), fmtRatios(vsRaw), median(vsSplit), fmtRatios(vsSplit))
			}
			capRow(t, s.label+", "+w.label, w.jobs, res[i], ratioCell, 10, w.work > 0)
		}
		t.note("commands per job by name, %s: cluster cap: %s; static split: %s", w.label, topCalls(meanCalls(ours), 12), topCalls(meanCalls(split), 8))
		most := maxRunning(ours)
		t.property(fmt.Sprintf("cap of 10 never exceeded inside the handlers, %s (max seen: %d)", w.label, most), most <= 10)
		cmds, rts := mean(ours.cmds), mean(ours.rts)
		if w.work == 0 {
			t.target("3 processes, cap 10, no-op jobs: >= 1.0x one raw asynq server (median of rounds)", median(vsRaw) >= 1.0)
			t.target("3 processes, cap 10, no-op jobs: >= 0.9x the static split (median of rounds)", median(vsSplit) >= 0.9)
			t.target(fmt.Sprintf("3 processes, cap 10, no-op jobs: <= 18 Redis commands per job (%.1f)", cmds), cmds <= 18)
		} else {
			util := busyShare(ours) / 10
			t.target("3 processes, cap 10, 2 ms jobs: >= 1.1x the static split (median of rounds)", median(vsSplit) >= 1.1)
			t.target(fmt.Sprintf("3 processes, cap 10, 2 ms jobs: >= 85%% of slots busy while a backlog exists (mean of rounds: %.0f%%)", 100*util), util >= 0.85)
			t.target(fmt.Sprintf("3 processes, cap 10, 2 ms jobs: <= 20 Redis commands per job (%.1f)", cmds), cmds <= 20)
		}
		t.target(fmt.Sprintf("3 processes, cap 10, %s: <= 2.5 round trips per job (%.2f)", w.label, rts), rts <= 2.5)
	}

	// One process: the cluster-wide gate against the per-process cap.
	setups := []capSetup{
		{label: "pool size 10, scope: process, 1 process", procs: 1, size: 10, scope: queues.ScopeProcess},
		{label: "pool size 10, scope: cluster, 1 process", procs: 1, size: 10, scope: queues.ScopeCluster},
	}
	res, err := capRounds(ctx, o, setups, work, short, rounds)
	if err != nil {
		return nil, err
	}
	r := perRound(res[1], res[0])
	capRow(t, setups[0].label+", 2 ms jobs", short, res[0], "-", 10, true)
	capRow(t, setups[1].label+", 2 ms jobs", short, res[1], fmt.Sprintf("%.2fx process scope (%s)", median(r), fmtRatios(r)), 10, true)
	t.target("1 process, 2 ms jobs: cluster scope >= 0.97x process scope (median of rounds)", median(r) >= 0.97)

	// One process, one pool of size 20: several dequeue loops against one
	// raw asynq server (one loop) of the same concurrency.
	const loops = 4
	setups = []capSetup{
		{label: "raw asynq, 1 process, C=20", raw: []int{20}},
		{label: fmt.Sprintf("pool size 20, scope: process, %d dequeue loops, 1 process", loops), procs: 1, size: 20, scope: queues.ScopeProcess, loops: loops},
	}
	res, err = capRounds(ctx, o, setups, 0, noop, rounds)
	if err != nil {
		return nil, err
	}
	r = perRound(res[1], res[0])
	capRow(t, setups[0].label+", no-op jobs", noop, res[0], "-", 20, false)
	capRow(t, setups[1].label+", no-op jobs", noop, res[1], fmt.Sprintf("%.2fx raw C=20 (%s)", median(r), fmtRatios(r)), 20, false)
	t.target("1 process, pool of 20 with several dequeue loops: >= 1.3x one raw asynq server of concurrency 20, no-op jobs (median of rounds)", median(r) >= 1.3)
	most := maxRunning(res[1])
	t.property(fmt.Sprintf("pool of 20 with several dequeue loops never runs more than 20 (max seen: %d)", most), most <= 20)

	t.note("a process is a runner or raw asynq server with its own Redis client (own connection pool) inside this bench process; all share its CPU; poll interval (TaskCheckInterval) 20 ms everywhere")
	t.note("each round drains a backlog enqueued up front; setups alternate order round by round; throughput = jobs / (last job done - servers started)")
	t.note("round trips/job: calls the setup's own Redis clients made (a pipeline or a script is one), from server start to the last job, divided by jobs; commands/job: INFO total_commands_processed over the same span (commands inside scripts count; any other client of this Redis adds to it)")
	t.note("CPU µs/job: Redis's (INFO cpu, user + system) and this bench process's (every setup's workers, getrusage) over the same span, divided by jobs")
	t.note("busy slots: jobs inside their handlers, integrated from the first start to the last start (the backlog is not empty until then), on one clock; divided by the cap (10, or 20); ms in handler: the mean time a job spent inside its handler, its sleep plus the delay before the Go runtime ran it again after its timer fired; throughput is busy slots divided by it, so it moves the ratios as much as busy slots do")
	return t, nil
}

// capSetup is one way to drain the backlog: raw asynq servers (raw lists
// the concurrency of each, one per process), or procs runners of one pool.
type capSetup struct {
	label string
	raw   []int
	procs int
	size  int
	scope queues.Scope
	loops int
}

// capResult is one setup's measure in each round.
type capResult struct {
	rate    []float64            // jobs/s per round
	rts     []float64            // round trips per job per round
	cmds    []float64            // commands per job per round
	busy    []float64            // mean busy slots per round
	held    []float64            // mean time a job spent inside its handler (ms) per round
	maxBusy []int                // most jobs running at once per round
	rcpu    []float64            // Redis's CPU time per job (µs) per round
	wcpu    []float64            // the bench process's CPU time per job (µs) per round, 0 when unknown
	calls   []map[string]float64 // per command, calls per job per round
}

func perRound(a, b *capResult) []float64 {
	out := make([]float64, len(a.rate))
	for i := range a.rate {
		out[i] = a.rate[i] / b.rate[i]
	}
	return out
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func busyShare(r *capResult) float64 { return mean(r.busy) }

func maxRunning(r *capResult) int { return slices.Max(r.maxBusy) }

// capRow prints a setup's row; busy slots only for jobs that take time
// (a no-op job is inside its handler for microseconds).
func capRow(t *Table, label string, jobs int, r *capResult, ratioCell string, capacity int, timed bool) {
	rates := make([]string, len(r.rate))
	for i, x := range r.rate {
		rates[i] = fmt.Sprintf("%.0f", x)
	}
	busy := "-"
	if timed {
		busy = fmt.Sprintf("%.2f / %d (%.0f%%), %.2f ms in handler", mean(r.busy), capacity, 100*mean(r.busy)/float64(capacity), mean(r.held))
	}
	cpu := fmt.Sprintf("%.0f, %.0f", mean(r.rcpu), mean(r.wcpu))
	t.row(label, jobs, strings.Join(rates, ", "), ratioCell, fmt.Sprintf("%.2f", mean(r.rts)), fmt.Sprintf("%.1f", mean(r.cmds)), cpu, busy, maxRunning(r))
}

// capRounds runs every setup once per round, in alternating order.
func capRounds(ctx context.Context, o *Options, setups []capSetup, work time.Duration, jobs, rounds int) ([]*capResult, error) {
	res := make([]*capResult, len(setups))
	for i := range res {
		res[i] = &capResult{}
	}
	for round := range rounds {
		order := make([]int, len(setups))
		for i := range order {
			order[i] = i
		}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, i := range order {
			var m capMeasure
			var err error
			// Labelled, so that a -cpuprofile tells the setups apart (go
			// tool pprof -tagfocus setup=cluster): goroutines the setup
			// starts carry its labels.
			pprof.Do(ctx, pprof.Labels("setup", setups[i].label, "work", work.String()), func(ctx context.Context) {
				m, err = capDrain(ctx, o, setups[i], work, jobs)
			})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", setups[i].label, err)
			}
			r := res[i]
			r.rate = append(r.rate, m.rate)
			r.rts = append(r.rts, m.rts)
			r.cmds = append(r.cmds, m.cmds)
			r.busy = append(r.busy, m.busy)
			r.held = append(r.held, m.held)
			r.maxBusy = append(r.maxBusy, m.maxBusy)
			r.rcpu = append(r.rcpu, m.rcpu)
			r.wcpu = append(r.wcpu, m.wcpu)
			r.calls = append(r.calls, m.calls)
		}
		o.Log.Info("clustercap round done", "round", round+1, "work", work)
	}
	return res, nil
}

type capMeasure struct {
	rate, rts, cmds, busy, held, rcpu, wcpu float64
	maxBusy                                 int
	calls                                   map[string]float64 // per command, per job
}

// jobTrace records, inside the handlers, when each job started and ended.
type jobTrace struct {
	t0     time.Time
	starts []int64 // ns since t0
	ends   []int64
	next   atomic.Int64
	c      *counter
}

func newJobTrace(n int) *jobTrace {
	return &jobTrace{t0: time.Now(), starts: make([]int64, n), ends: make([]int64, n), c: newCounter(n)}
}

func (tr *jobTrace) handle(work time.Duration) func(context.Context, *asynq.Task) error {
	return func(context.Context, *asynq.Task) error {
		i := tr.next.Add(1) - 1
		if int(i) >= len(tr.starts) {
			return nil // a job run twice: not counted
		}
		tr.starts[i] = int64(time.Since(tr.t0))
		if work > 0 {
			time.Sleep(work) // the job's own work (I/O)
		}
		tr.ends[i] = int64(time.Since(tr.t0))
		tr.c.add()
		return nil
	}
}

// busy returns the mean number of jobs running between the first start
// and the last start, and the most running at once.
func (tr *jobTrace) busy() (float64, int) {
	type ev struct {
		at int64
		d  int
	}
	evs := make([]ev, 0, 2*len(tr.starts))
	first, last := tr.starts[0], tr.starts[0]
	for i := range tr.starts {
		evs = append(evs, ev{tr.starts[i], 1}, ev{tr.ends[i], -1})
		first, last = min(first, tr.starts[i]), max(last, tr.starts[i])
	}
	// Ends before starts at the same instant: a slot handed on is not two.
	slices.SortFunc(evs, func(a, b ev) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.d - b.d
	})
	running, most := 0, 0
	var area float64
	prev := evs[0].at
	for _, e := range evs {
		if from, to := max(prev, first), min(e.at, last); to > from {
			area += float64(running) * float64(to-from)
		}
		prev = e.at
		running += e.d
		most = max(most, running)
	}
	if last == first {
		return float64(most), most
	}
	return area / float64(last-first), most
}

// held returns the mean time a job spent inside its handler, in ms: for
// a job that sleeps, the sleep and the delay before the Go runtime ran it
// again after its timer fired.
func (tr *jobTrace) held() float64 {
	var sum int64
	for i := range tr.starts {
		sum += tr.ends[i] - tr.starts[i]
	}
	return float64(sum) / float64(len(tr.starts)) / 1e6
}

// rtCounter counts the calls a Redis client makes: one per command sent
// alone, one per pipeline (a script run is one command).
type rtCounter struct{ n atomic.Int64 }

func (c *rtCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *rtCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *rtCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// capDrain drains one backlog of jobs with one setup.
func capDrain(ctx context.Context, o *Options, s capSetup, work time.Duration, jobs int) (capMeasure, error) {
	ns, clean := namespace(o, "cap")
	defer clean()
	opts, err := redis.ParseURL(o.RedisURL)
	if err != nil {
		return capMeasure{}, err
	}
	procs := len(s.raw)
	if procs == 0 {
		procs = s.procs
	}
	rts := &rtCounter{}
	conns := make([]*redis.Client, procs)
	for i := range conns {
		conns[i] = redis.NewClient(opts)
		conns[i].AddHook(rts)
	}
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	tr := newJobTrace(jobs)
	var starters []func() error
	var stoppers []func()
	defer func() {
		for _, stop := range stoppers {
			stop()
		}
	}()
	if len(s.raw) > 0 {
		q := ns + ":q"
		if err := fill(ctx, o.Redis, q, "job", jobs); err != nil {
			return capMeasure{}, err
		}
		h := asynq.HandlerFunc(tr.handle(work))
		for i, conc := range s.raw {
			srv := asynq.NewServerFromRedisClient(conns[i], asynq.Config{
				Concurrency: conc, Queues: map[string]int{q: 1}, TaskCheckInterval: 20 * time.Millisecond, Logger: quietLogger(),
			})
			starters = append(starters, func() error { return srv.Start(h) })
			stoppers = append(stoppers, srv.Shutdown)
		}
	} else {
		h := queues.NewHandlers()
		h.HandleFunc("job", tr.handle(work))
		cfg := queues.Config{Namespace: ns, Logger: slog.New(slog.DiscardHandler), Handlers: h, Pools: []queues.PoolConfig{{
			Name: "cap", Size: s.size, JobTypes: []string{"job"}, PollInterval: 20 * time.Millisecond, Scope: s.scope, DequeueLoops: s.loops,
		}}}
		if err := fill(ctx, o.Redis, queues.QueueName(ns, "cap", ""), "job", jobs); err != nil {
			return capMeasure{}, err
		}
		for i := range procs {
			c, err := queues.NewClient(conns[i], cfg)
			if err != nil {
				return capMeasure{}, err
			}
			starters = append(starters, func() error { return c.Start(ctx) })
			stoppers = append(stoppers, func() { stopClient(c) })
		}
	}
	callsBefore, err := commandCalls(ctx, o)
	if err != nil {
		return capMeasure{}, err
	}
	cmdsBefore, err := commandsProcessed(ctx, o)
	if err != nil {
		return capMeasure{}, err
	}
	rcpuBefore, err := redisCPU(ctx, o)
	if err != nil {
		return capMeasure{}, err
	}
	wcpuBefore := processCPU()
	rts.n.Store(0)
	start := time.Now()
	for _, st := range starters {
		if err := st(); err != nil {
			return capMeasure{}, err
		}
	}
	err = tr.c.wait(ctx, 5*time.Minute)
	took := time.Since(start)
	calls := rts.n.Load()
	wcpuAfter := processCPU()
	rcpuAfter, rerr := redisCPU(ctx, o)
	cmdsAfter, cerr := commandsProcessed(ctx, o)
	if err != nil {
		return capMeasure{}, err
	}
	callsAfter, err := commandCalls(ctx, o)
	if err != nil {
		return capMeasure{}, err
	}
	if cerr != nil {
		return capMeasure{}, cerr
	}
	if rerr != nil {
		return capMeasure{}, rerr
	}
	busy, most := tr.busy()
	held := tr.held()
	perJob := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(jobs) }
	m := capMeasure{
		rate: float64(jobs) / took.Seconds(), rts: float64(calls) / float64(jobs),
		cmds: float64(cmdsAfter-cmdsBefore-1) / float64(jobs), busy: busy, held: held, maxBusy: most,
		rcpu: perJob(rcpuAfter - rcpuBefore), wcpu: perJob(wcpuAfter - wcpuBefore),
		calls: perJobCalls(callsBefore, callsAfter, jobs),
	}
	return m, nil
}
