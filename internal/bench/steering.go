package bench

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/priority"
	"github.com/lci-labs/compartment/queues"
)

// runSteering measures the two steering controls of docs/STEERING.md in
// one run, each beside the same pool without it: the start latency of
// regulatory reports arriving into a pool saturated by long management
// reports, with one of its four slots reserved for regulatory and without;
// and the longest wait of ad-hoc reports under a saturating regulatory
// stream, with a maximum wait and without, against the stated bound.
func runSteering(ctx context.Context, o *Options) (*Table, error) {
	t := &Table{Header: []string{"case", "pool (size 4, two worker clients)", "samples", "p50", "p99", "max", "lower-tier starts/s"}}
	long := o.d(600*time.Millisecond, 200*time.Millisecond)
	arrivals := o.n(15, 3)
	var lat [2]latencies
	for i, reserved := range []bool{false, true} {
		l, rate, err := reservedLatency(ctx, o, reserved, long, arrivals)
		if err != nil {
			return nil, err
		}
		lat[i] = l
		what := "no reservation"
		if reserved {
			what = "reserved: {regulatory: 1}"
		}
		t.row("regulatory start latency", fmt.Sprintf("%s, busy with %s management reports", what, long), len(l), ms(l.pct(.5)), ms(l.pct(.99)), ms(l.pct(1)), fmt.Sprintf("%.1f", rate))
	}
	t.note("regulatory p99 with a reserved slot / without: %s (poll interval %s: asynq picks a job up within 1.5 of them)", ratio(float64(lat[1].pct(.99)), float64(lat[0].pct(.99))), steeringPoll)
	t.note("the cost: management reports get 3 slots instead of 4 while no regulatory report runs (lower-tier starts/s)")
	t.target("regulatory p99 with a reserved slot within 1.5 poll intervals + 50ms", lat[1].pct(.99) <= steeringPoll*3/2+50*time.Millisecond)
	t.target("a reserved slot cuts regulatory start latency (p99 below the unreserved pool's)", lat[1].pct(.99) < lat[0].pct(.99))

	work := o.d(150*time.Millisecond, 50*time.Millisecond)
	maxWait := max(queues.MinMaxWait, o.d(1500*time.Millisecond, time.Second))
	window := 2*maxWait + 4*work
	adhoc := o.n(5, 2)
	bound := maxWait + work + steeringPoll*3/2
	var longest [2]time.Duration
	var started [2]int
	for i, guard := range []bool{false, true} {
		waits, n, err := agedWaits(ctx, o, guard, work, maxWait, window, adhoc)
		if err != nil {
			return nil, err
		}
		longest[i], started[i] = waits.pct(1), n
		what, p50, p99, maxCell := "no max_wait", ms(waits.pct(.5)), ms(waits.pct(.99)), ms(waits.pct(1))
		if guard {
			what = fmt.Sprintf("max_wait: {adhoc: %s}", maxWait)
		}
		if n < adhoc {
			// The percentiles of the waits are unknown: some never ended.
			p50, p99, maxCell = "-", "-", fmt.Sprintf("> %s (%d of %d never started)", window, adhoc-n, adhoc)
		}
		t.row("ad-hoc wait under a regulatory stream", fmt.Sprintf("%s, %s regulatory reports", what, work), adhoc, p50, p99, maxCell, "-")
	}
	t.note("bound on an aged job's wait: max_wait + one running job's time + 1.5 poll intervals = %s; longest measured with the guard: %s", bound, ms(longest[1]))
	t.note("without a max_wait strict order holds: ad-hoc reports wait as long as regulatory work is pending (the window was %s)", window)
	t.property("with max_wait every ad-hoc report started", started[1] == adhoc)
	t.target(fmt.Sprintf("longest ad-hoc wait with max_wait within the bound (%s) + 100ms", bound), started[1] == adhoc && longest[1] <= bound+100*time.Millisecond)
	t.property("without max_wait no ad-hoc report started while regulatory work was pending", started[0] == 0)
	return t, nil
}

// steeringPoll is the poll interval of the pools of this section.
const steeringPoll = 50 * time.Millisecond

// steeringPool runs a strict pool of four tiers on two worker clients;
// handler is called at each start with the tier and the payload.
type steeringPool struct {
	client *queues.Client
	stop   func()
}

func startSteeringPool(ctx context.Context, o *Options, section string, pc queues.PoolConfig, handler func(ctx context.Context, tier, payload string)) (*steeringPool, error) {
	ns, clean := namespace(o, section)
	policy, err := priority.New(priority.Config{Tiers: []string{"regulatory", "close", "management", "adhoc"}, Default: "adhoc"})
	if err != nil {
		clean()
		return nil, err
	}
	pc.Name, pc.JobTypes, pc.PollInterval = "batch", []string{"steer:job"}, steeringPoll
	pc.Tiers = []string{"regulatory", "close", "management", "adhoc"}
	cfg := queues.Config{Namespace: ns, Tiers: policy, Logger: slog.New(slog.DiscardHandler), Pools: []queues.PoolConfig{pc}}
	enq, err := queues.NewClient(o.Redis, cfg)
	if err != nil {
		clean()
		return nil, err
	}
	pool, err := enq.Pool("batch")
	if err != nil {
		clean()
		return nil, err
	}
	mux := queues.NewHandlers()
	mux.HandleFunc("steer:job", func(ctx context.Context, t *asynq.Task) error {
		q, _ := asynq.GetQueueName(ctx)
		handler(ctx, pool.TierOf(q), string(t.Payload()))
		return nil
	})
	var workers []*queues.Client
	stop := func() {
		for _, w := range workers {
			stopClient(w)
		}
		clean()
	}
	for range 2 {
		w, err := startClient(ctx, o, cfg, mux)
		if err != nil {
			stop()
			return nil, err
		}
		workers = append(workers, w)
	}
	return &steeringPool{client: enq, stop: stop}, nil
}

func (p *steeringPool) enqueue(ctx context.Context, tier, payload string) error {
	_, err := p.client.Enqueue(ctx, "steer:job", []byte(payload), queues.EnqueueOptions{Tier: tier})
	return err
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// reservedLatency keeps a pool of 4 busy with management reports of long
// each and enqueues regulatory reports one at a time, at times unrelated
// to the management reports' ends; it returns each one's enqueue-to-start
// latency and the management starts per second.
func reservedLatency(ctx context.Context, o *Options, reserved bool, long time.Duration, arrivals int) (latencies, float64, error) {
	pc := queues.PoolConfig{Size: 4}
	if reserved {
		pc.Reserved = map[string]int{"regulatory": 1}
	}
	var mu sync.Mutex
	startedAt := map[string]time.Time{}
	lower := 0
	p, err := startSteeringPool(ctx, o, "reserved", pc, func(ctx context.Context, tier, payload string) {
		mu.Lock()
		if tier == "regulatory" {
			startedAt[payload] = time.Now()
		} else {
			lower++
		}
		mu.Unlock()
		if tier != "regulatory" {
			_ = sleepCtx(ctx, long)
		}
	})
	if err != nil {
		return nil, 0, err
	}
	defer p.stop()
	// Enough management reports to keep every slot busy for the run.
	run := time.Duration(arrivals) * long
	for i := range int(run/long)*4 + 8 {
		if err := p.enqueue(ctx, "management", strconv.Itoa(i)); err != nil {
			return nil, 0, err
		}
	}
	if err := sleepCtx(ctx, long/2); err != nil { // the pool fills
		return nil, 0, err
	}
	mu.Lock()
	lower0, t0 := lower, time.Now()
	mu.Unlock()
	var out latencies
	for i := range arrivals {
		// Arrive at a point of the management reports' run unrelated to
		// their ends: a prime fraction of long apart.
		if err := sleepCtx(ctx, long*time.Duration(3+(i*7)%11)/13); err != nil {
			return nil, 0, err
		}
		id := "r" + strconv.Itoa(i)
		at := time.Now()
		if err := p.enqueue(ctx, "regulatory", id); err != nil {
			return nil, 0, err
		}
		deadline := time.Now().Add(10*long + 5*time.Second)
		for {
			mu.Lock()
			s, ok := startedAt[id]
			mu.Unlock()
			if ok {
				out = append(out, s.Sub(at))
				break
			}
			if time.Now().After(deadline) {
				return nil, 0, fmt.Errorf("regulatory report %d did not start within %s", i, 10*long+5*time.Second)
			}
			if err := sleepCtx(ctx, time.Millisecond); err != nil {
				return nil, 0, err
			}
		}
	}
	mu.Lock()
	rate := float64(lower-lower0) / time.Since(t0).Seconds()
	mu.Unlock()
	return out, rate, nil
}

// agedWaits keeps a pool of 4 saturated with regulatory reports of work
// each for window, enqueues ad-hoc reports spread over the first third of
// it, and returns the waits of those that started within window and their
// number.
func agedWaits(ctx context.Context, o *Options, guard bool, work, maxWait, window time.Duration, adhoc int) (latencies, int, error) {
	pc := queues.PoolConfig{Size: 4}
	if guard {
		pc.MaxWait = map[string]time.Duration{"adhoc": maxWait}
	}
	var mu sync.Mutex
	startedAt := map[string]time.Time{}
	p, err := startSteeringPool(ctx, o, "aged", pc, func(ctx context.Context, tier, payload string) {
		if tier == "adhoc" {
			mu.Lock()
			startedAt[payload] = time.Now()
			mu.Unlock()
		}
		_ = sleepCtx(ctx, work)
	})
	if err != nil {
		return nil, 0, err
	}
	defer p.stop()
	// More regulatory work than the window holds: the stream never runs dry.
	for i := range int(window/work)*4*2 + 16 {
		if err := p.enqueue(ctx, "regulatory", strconv.Itoa(i)); err != nil {
			return nil, 0, err
		}
	}
	if err := sleepCtx(ctx, work); err != nil {
		return nil, 0, err
	}
	t0 := time.Now()
	enqueuedAt := map[string]time.Time{}
	for i := range adhoc {
		id := "a" + strconv.Itoa(i)
		enqueuedAt[id] = time.Now()
		if err := p.enqueue(ctx, "adhoc", id); err != nil {
			return nil, 0, err
		}
		if err := sleepCtx(ctx, window/3/time.Duration(adhoc)); err != nil {
			return nil, 0, err
		}
	}
	for time.Since(t0) < window {
		mu.Lock()
		n := len(startedAt)
		mu.Unlock()
		if n == adhoc {
			break
		}
		if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
			return nil, 0, err
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var out latencies
	for id, s := range startedAt {
		out = append(out, s.Sub(enqueuedAt[id]))
	}
	return out, len(out), nil
}
