package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/queues"
)

type stat struct {
	n   int64
	dur time.Duration
}

type hook struct {
	mu sync.Mutex
	m  map[string]*stat
}

func (h *hook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		t := time.Now()
		err := next(ctx, cmd)
		d := time.Since(t)
		name := cmd.Name()
		args := cmd.Args()
		if (name == "evalsha" || name == "eval") && len(args) > 3 {
			name += " " + fmt.Sprint(args[3])
			if len(name) > 40 {
				name = name[:40]
			}
		}
		res := ""
		if c, ok := cmd.(*redis.Cmd); ok {
			v, _ := c.Result()
			if sl, ok := v.([]any); ok && len(sl) > 0 {
				res = fmt.Sprint(sl[0])
				if len(sl) > 1 {
					res += fmt.Sprintf("+%d", len(sl)-1)
				}
			} else if v == nil {
				res = "nil"
			} else {
				res = "x"
			}
		}
		if len(res) > 6 {
			res = "msg"
		}
		h.mu.Lock()
		k := name + " r=" + res
		s := h.m[k]
		if s == nil {
			s = &stat{}
			h.m[k] = s
		}
		s.n++
		s.dur += d
		h.mu.Unlock()
		return err
	}
}
func (h *hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func main() {
	ctx := context.Background()
	jobs, _ := strconv.Atoi(os.Getenv("JOBS"))
	if jobs == 0 {
		jobs = 4000
	}
	procs, _ := strconv.Atoi(os.Getenv("PROCS"))
	maxSize, _ := strconv.Atoi(os.Getenv("MAXSIZE"))
	work, _ := time.ParseDuration(os.Getenv("WORK"))
	opts, _ := redis.ParseURL("redis://127.0.0.1:6379/10")
	admin := redis.NewClient(opts)
	ns := fmt.Sprintf("trace%d", time.Now().UnixNano()%100000)
	h := &hook{m: map[string]*stat{}}
	t0 := time.Now()
	starts := make([]int64, jobs)
	ends := make([]int64, jobs)
	var next atomic.Int64
	done := make(chan struct{})
	var cnt atomic.Int64
	hs := queues.NewHandlers()
	hs.HandleFunc("job", func(context.Context, *asynq.Task) error {
		i := next.Add(1) - 1
		starts[i] = int64(time.Since(t0))
		if work > 0 {
			time.Sleep(work)
		}
		ends[i] = int64(time.Since(t0))
		if cnt.Add(1) == int64(jobs) {
			close(done)
		}
		return nil
	})
	cfg := queues.Config{Namespace: ns, Logger: slog.New(slog.DiscardHandler), Handlers: hs, Pools: []queues.PoolConfig{{
		Name: "cap", Size: 10, MaxSize: maxSize, JobTypes: []string{"job"}, PollInterval: 20 * time.Millisecond,
	}}}
	c := asynq.NewClientFromRedisClient(admin)
	for i := range jobs {
		c.Enqueue(asynq.NewTask("job", []byte(fmt.Sprint(i))), asynq.Queue(queues.QueueName(ns, "cap", "")))
	}
	var clients []*queues.Client
	t0 = time.Now()
	for range procs {
		rdb := redis.NewClient(opts)
		rdb.AddHook(h)
		cl, err := queues.NewClient(rdb, cfg)
		if err != nil {
			panic(err)
		}
		if err := cl.Start(ctx); err != nil {
			panic(err)
		}
		clients = append(clients, cl)
	}
	<-done
	took := time.Since(t0)
	for _, cl := range clients {
		cl.Stop(ctx)
	}
	fmt.Printf("jobs/s %.0f\n", float64(jobs)/took.Seconds())
	keys := make([]string, 0)
	for k := range h.m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		s := h.m[k]
		if float64(s.n)/float64(jobs) < 0.01 {
			continue
		}
		fmt.Printf("%-60s n=%6d per job=%.2f mean=%s\n", k, s.n, float64(s.n)/float64(jobs), s.dur/time.Duration(s.n))
	}
	ss := slices.Clone(starts)
	slices.Sort(ss)
	var gaps []int64
	last := ss[len(ss)-1]
	for _, e := range ends {
		if e > last {
			continue
		}
		j, _ := slices.BinarySearch(ss, e)
		if j < len(ss) {
			gaps = append(gaps, ss[j]-e)
		}
	}
	slices.Sort(gaps)
	pc := func(p float64) time.Duration { return time.Duration(gaps[int(p*float64(len(gaps)-1))]) }
	fmt.Println("gap end->next start p50", pc(.5), "p90", pc(.9), "p99", pc(.99))
	var sumRun float64
	for i := range starts {
		sumRun += float64(ends[i] - starts[i])
	}
	fmt.Printf("mean job time inside handler %s, util %.2f\n", time.Duration(sumRun/float64(jobs)), sumRun/float64(last-ss[0])/10)
	iter := admin.Scan(ctx, 0, ns+"*", 1000).Iterator()
	for iter.Next(ctx) {
		admin.Del(ctx, iter.Val())
	}
	insp := asynq.NewInspectorFromRedisClient(admin)
	insp.DeleteQueue(queues.QueueName(ns, "cap", ""), true)
}
