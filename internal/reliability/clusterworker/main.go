// Command clusterworker is a test program for the cluster-wide gate: one
// worker process with a single cluster-scoped pool whose handler records,
// in Redis, every start and end, so a test running three of them can
// observe from inside the handlers what happens across processes. It is
// built and run by the tests in internal/reliability only.
//
//	clusterworker (-redis URL | -redis-cluster host:port,...) -namespace NS -size N [-max-size M] [-tiers a,b,c] [-work 5ms] [-clock-offset 30s]
//	              [-breaker-probes N -breaker-cool-down 1s] [-record-queue]
//	              [-reserved regulatory=1,close=1] [-recover-after 15s] [-record-pid] [-plain]
//	              [-run-step run:done] [-kill-at N -kill-point handler|finished|due] [-poll-interval 10ms]
//
// With -record-pid each start also appends "<seq> <pid> <µs>" to
// NS:obs:pids, so a test that kills processes knows which jobs each ran,
// and each recovery this process makes appends "<µs> <silent µs> <n>" to
// NS:obs:recovered (n jobs put back, their leases unrenewed that long).
//
// With -plain the process is a plain asynq server of -size workers on the
// queue NS:plain, without the engine: the baseline a test compares with.
//
// With -redis-cluster the Redis is a Redis Cluster (seed nodes), and the
// observation keys below are {NS:obs}:... instead of NS:obs:..., so that
// the scripts that update several of them touch one slot.
//
// With -record-queue the handler also appends "<seq> <queue>" to NS:obs:queues
// at each start: the queue asynq handed the job out from.
//
// Each start also appends "µs n" to NS:obs:counts: Redis's time and the
// jobs running across processes, this one included, counted in the same
// step.
//
// With -breaker-probes the pool has a circuit breaker (min_calls 3), and
// the handler fails while the key NS:obs:down exists; while NS:obs:watch
// exists it also counts the jobs inside across processes under
// NS:obs:watch-*, with a violation past the probes.
//
// With -run-step TYPE the pool also takes jobs of TYPE, a run's completion
// step: its handler appends "<µs> <pid> <job ID> <run ID>" to NS:obs:steps
// each time it runs, and does nothing else.
//
// With -kill-at N the process that finishes the Nth report:run job,
// counted across processes with INCR NS:obs:finished, appends
// "<µs> <pid> <point> <job ID>" to NS:obs:kills and kills itself with
// SIGKILL, at -kill-point:
//
//   - handler: in the handler, after the work, before it returns: the
//     engine has not recorded the job's end in its run, and asynq has not
//     heard of it either; the job is taken back and runs again elsewhere.
//   - finished: in the Observer's JobFinished, called once the engine
//     recorded the job's end in its run (and, when that end was the run's
//     last, enqueued the run's completion step) and before asynq's write
//     of the outcome; the job is taken back, and the run's record says it
//     succeeded already.
//   - due: when the engine's record of a job's end answers that the run's
//     completion step is now due (any N: the end that settles the run),
//     before this process enqueues the step; the other processes' keeper
//     must enqueue it. The record is written then, the job ID is "-".
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/priority"
	"github.com/lci-labs/compartment/queues"
)

// startScript records a start: the running count across processes goes up,
// a violation is counted when it passes the size, the start (time and
// tier) is appended to the start list and, with a fourth key, Redis's time
// and the count to that list.
var startScript = redis.NewScript(`
local n = redis.call("INCR", KEYS[1])
if n > tonumber(ARGV[1]) then redis.call("INCR", KEYS[2]) end
redis.call("RPUSH", KEYS[3], ARGV[2])
if KEYS[4] then
  local t = redis.call("TIME")
  redis.call("RPUSH", KEYS[4], t[1] .. string.format("%06d", tonumber(t[2])) .. " " .. n)
end
return n
`)

func main() {
	url := flag.String("redis", "", "Redis URL")
	clusterAddrs := flag.String("redis-cluster", "", "seed nodes of a Redis Cluster, host:port,... (instead of -redis)")
	ns := flag.String("namespace", "", "queue namespace")
	size := flag.Int("size", 1, "pool size")
	maxSize := flag.Int("max-size", 0, "the pool's max_size (0: its size); a violation is more than this many at once")
	tiers := flag.String("tiers", "", "comma-separated tiers, highest first")
	work := flag.Duration("work", 5*time.Millisecond, "work per job (the handler ignores its context, as a stuck query would)")
	offset := flag.Duration("clock-offset", 0, "run the engine on a clock this far off the real one")
	shutdown := flag.Duration("shutdown-timeout", 5*time.Second, "how long running jobs get on SIGTERM")
	probes := flag.Int("breaker-probes", 0, "give the pool a circuit breaker with this many probes (0: none)")
	coolDown := flag.Duration("breaker-cool-down", time.Second, "the breaker's cool-down (and its cap)")
	recordQueue := flag.Bool("record-queue", false, "record the queue of each start under NS:obs:queues")
	reserved := flag.String("reserved", "", "slots reserved per tier: tier=n,tier=n")
	recoverAfter := flag.Duration("recover-after", 0, "the engine's recover_after (0: its default)")
	recordPid := flag.Bool("record-pid", false, "record the process of each start under NS:obs:pids")
	plain := flag.Bool("plain", false, "run a plain asynq server on the queue NS:plain instead of the engine")
	poll := flag.Duration("poll-interval", 10*time.Millisecond, "the pool's poll_interval: how often an idle worker looks for a job")
	runStep := flag.String("run-step", "", "also take jobs of this type, a run's completion step, recording each under NS:obs:steps")
	killAt := flag.Int64("kill-at", 0, "SIGKILL this process when it finishes the Nth report:run across processes (0: never)")
	killPoint := flag.String("kill-point", "handler", "where -kill-at kills: handler, finished (the observer's JobFinished) or due (a run's step due)")
	flag.Parse()
	if *killAt > 0 && *killPoint != "handler" && *killPoint != "finished" && *killPoint != "due" {
		fmt.Fprintln(os.Stderr, "-kill-point: want handler, finished or due, got", *killPoint)
		os.Exit(2)
	}
	var rdb redis.UniversalClient
	obs := *ns + ":obs:"
	if *clusterAddrs != "" {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(*clusterAddrs, ",")})
		obs = "{" + *ns + ":obs}:"
	} else {
		opts, err := redis.ParseURL(*url)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		rdb = redis.NewClient(opts)
	}
	defer rdb.Close()
	var err error
	// killSelf records the kill and dies at once: no deferred call, no
	// shutdown, nothing written to Redis after the record.
	killSelf := func(point, job string) {
		rdb.RPush(context.Background(), obs+"kills", fmt.Sprintf("%d %d %s %s", time.Now().UnixMicro(), os.Getpid(), point, job))
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal lands before this blocks for long
	}
	// finished counts a finished report:run across processes and kills
	// this process at the -kill-at-th.
	finished := func(job string) {
		if rdb.Incr(context.Background(), obs+"finished").Val() == *killAt {
			killSelf(*killPoint, job)
		}
	}
	if *killAt > 0 && *killPoint == "due" {
		rdb.AddHook(dueKillHook{kill: func() { killSelf("due", "-") }})
	}

	pc := queues.PoolConfig{Name: "batch", Size: *size, MaxSize: *maxSize, JobTypes: []string{"report:run"}, PollInterval: *poll, Scope: queues.ScopeCluster}
	if *runStep != "" {
		pc.JobTypes = append(pc.JobTypes, *runStep)
	}
	var pol *priority.Policy
	if *tiers != "" {
		list := strings.Split(*tiers, ",")
		pol, err = priority.New(priority.Config{Tiers: list, Default: list[len(list)-1]})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		pc.Tiers = list
	}
	if *reserved != "" {
		pc.Reserved = map[string]int{}
		for _, kv := range strings.Split(*reserved, ",") {
			var n int
			tier, count, _ := strings.Cut(kv, "=")
			if _, err := fmt.Sscan(count, &n); err != nil {
				fmt.Fprintln(os.Stderr, "-reserved:", err)
				os.Exit(2)
			}
			pc.Reserved[tier] = n
		}
	}
	if *probes > 0 {
		pc.Breaker = &queues.BreakerConfig{MinCalls: 3, Window: 30 * time.Second, CoolDown: *coolDown, MaxCoolDown: *coolDown, Probes: *probes}
	}
	inside, violations, starts, counts := obs+"inside", obs+"violations", obs+"starts", obs+"counts"
	limit := max(*size, *maxSize)
	watchKeys := []string{obs + "watch-inside", obs + "watch-violations", obs + "watch-starts"}
	mux := queues.NewHandlers()
	mux.HandleFunc("report:run", func(ctx context.Context, t *asynq.Task) error {
		var p struct {
			Seq  int    `json:"seq"`
			Tier string `json:"tier"`
		}
		_ = json.Unmarshal(t.Payload(), &p)
		bg := context.WithoutCancel(ctx)
		rec := fmt.Sprintf("%d %d %s +", time.Now().UnixMicro(), p.Seq, p.Tier)
		if err := startScript.Run(bg, rdb, []string{inside, violations, starts, counts}, limit, rec).Err(); err != nil {
			return err
		}
		if *recordPid {
			if err := rdb.RPush(bg, obs+"pids", fmt.Sprintf("%d %d %d", p.Seq, os.Getpid(), time.Now().UnixMicro())).Err(); err != nil {
				return err
			}
		}
		if *recordQueue {
			q, _ := asynq.GetQueueName(ctx)
			if err := rdb.RPush(bg, obs+"queues", fmt.Sprintf("%d %s", p.Seq, q)).Err(); err != nil {
				return err
			}
		}
		watched := *probes > 0 && rdb.Exists(bg, obs+"watch").Val() == 1
		if watched {
			if err := startScript.Run(bg, rdb, watchKeys, *probes, rec).Err(); err != nil {
				return err
			}
		}
		time.Sleep(*work)
		rdb.Decr(bg, inside)
		rdb.RPush(bg, starts, fmt.Sprintf("%d %d %s -", time.Now().UnixMicro(), p.Seq, p.Tier))
		if watched {
			rdb.Decr(bg, watchKeys[0])
		}
		if *probes > 0 && rdb.Exists(bg, obs+"down").Val() == 1 {
			return fmt.Errorf("the dependency is down")
		}
		if *killAt > 0 && *killPoint == "handler" {
			id, _ := asynq.GetTaskID(ctx)
			finished(id)
		}
		return nil
	})
	if *runStep != "" {
		mux.HandleFunc(*runStep, func(ctx context.Context, t *asynq.Task) error {
			var p struct {
				Run struct {
					ID string `json:"id"`
				} `json:"run"`
			}
			_ = json.Unmarshal(t.Payload(), &p)
			id, _ := asynq.GetTaskID(ctx)
			return rdb.RPush(context.WithoutCancel(ctx), obs+"steps", fmt.Sprintf("%d %d %s %s", time.Now().UnixMicro(), os.Getpid(), id, p.Run.ID)).Err()
		})
	}
	var observer queues.Observer
	if *killAt > 0 && *killPoint == "finished" {
		observer = finishObserver(func(e queues.JobEnd) {
			if e.JobType == "report:run" && e.Started && e.Outcome == queues.OutcomeSucceeded {
				finished(e.JobID)
			}
		})
	}
	// Errors go to stderr, where a test looks for slot errors; the rest is
	// discarded.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	if *plain {
		srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: *size, Queues: map[string]int{*ns + ":plain": 1},
			ShutdownTimeout: *shutdown, LogLevel: asynq.FatalLevel, RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Second }})
		if err := srv.Start(mux); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("clusterworker running (plain asynq)")
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		<-ctx.Done()
		srv.Shutdown()
		return
	}
	runner, err := queues.NewClient(rdb, queues.Config{Namespace: *ns, Tiers: pol, Pools: []queues.PoolConfig{pc}, Handlers: mux, Logger: log, ShutdownTimeout: *shutdown, Observer: observer,
		RecoverAfter: *recoverAfter, Clock: func() time.Time { return time.Now().Add(*offset) }, OnRecover: func(r queues.Recovery) {
			if *recordPid {
				rdb.RPush(context.Background(), obs+"recovered", fmt.Sprintf("%d %d %d", time.Now().UnixMicro(), r.Silent.Microseconds(), len(r.Jobs)))
			}
		}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := runner.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("clusterworker running")
	<-ctx.Done()
	_ = runner.Stop(context.Background())
}

// finishObserver is a queues.Observer that passes each job's end to its
// func: the runner calls JobFinished after it recorded the job's end in
// the job's run, before it returns the outcome to asynq.
type finishObserver func(queues.JobEnd)

func (finishObserver) JobStarted(queues.JobStart) {}

func (f finishObserver) JobFinished(e queues.JobEnd) { f(e) }

// dueKillHook calls kill when a script on a run's record (its first key
// holds ":runs:run:") answers {1, steps} with steps not empty: the end of
// a job of the run was recorded and made the run's completion step due
// (lua/run_end.lua), and the process is about to enqueue the step.
type dueKillHook struct{ kill func() }

func (dueKillHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (dueKillHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h dueKillHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil || (cmd.Name() != "evalsha" && cmd.Name() != "eval") {
			return err
		}
		args := cmd.Args() // eval(sha) script numkeys key...
		if len(args) < 4 {
			return err
		}
		if key, _ := args[3].(string); !strings.Contains(key, ":runs:run:") && !strings.Contains(key, ":runs}:run:") {
			return err
		}
		c, ok := cmd.(*redis.Cmd)
		if !ok {
			return err
		}
		if v, ok := c.Val().([]any); ok && len(v) == 2 && v[0] == int64(1) {
			if steps, _ := v[1].(string); steps != "" {
				h.kill()
			}
		}
		return err
	}
}
