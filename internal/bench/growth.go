package bench

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/lci-labs/compartment/queues"
)

// runGrowth measures how what a job costs Redis grows with the number of
// worker processes and with the pool's size: a backlog of 1 ms jobs
// drained by a cluster-scoped pool and, beside it, by raw asynq servers
// with a static split of the same slots. Redis is single-threaded, so its
// CPU time per job sets the most jobs per second one Redis node can carry
// whatever the number of workers; a cost per job that grew with the
// processes or the slots would lower that ceiling as users grow.
//
// Processes are as in the clustercap section: each a runner (or raw asynq
// server) with its own Redis client inside this bench process, so 30 of
// them are 30 sets of asynq's goroutines and connections on two cores,
// goroutine-light but each talking to Redis as a process of its own would.
func runGrowth(ctx context.Context, o *Options) (*Table, error) {
	t := &Table{Header: []string{"setup", "jobs", "jobs/s", "ratio vs static split", "busy slots", "round trips/job", "commands/job", "CPU µs/job: Redis, workers", "most frequent commands per job"}}
	const work = time.Millisecond
	jobs := o.n(10000, 300)
	// Three rounds per setup: one round's commands per job moved by up to
	// 1.9x between runs minutes apart on a shared machine.
	rounds := o.n(3, 1)

	type point struct {
		x          float64
		cmds, rcpu float64
	}
	var byProcs, bySize []point
	run := func(label string, x float64, procs, size int, split []int) (point, error) {
		setups := []capSetup{
			{label: fmt.Sprintf("raw asynq, %d processes, static split of %d", len(split), size), raw: split},
			{label: fmt.Sprintf("pool size %d, scope: cluster, %d processes", size, procs), procs: procs, size: size, scope: queues.ScopeCluster},
		}
		n := jobs
		if size >= 100 {
			n = 2 * jobs // more slots take longer to fill: keep the drain well past its ramp
		}
		res, err := capRounds(ctx, o, setups, work, n, rounds)
		if err != nil {
			return point{}, err
		}
		raw, ours := res[0], res[1]
		r := perRound(ours, raw)
		for i, s := range setups {
			ratio := "-"
			if i == 1 {
				ratio = fmt.Sprintf("%.2fx (%s)", median(r), fmtRatios(r))
			}
			t.row(s.label+", 1 ms jobs", n, fmt.Sprintf("%.0f", mean(res[i].rate)), ratio,
				fmt.Sprintf("%.0f%%, %.2f ms in handler", 100*busyShare(res[i])/float64(size), mean(res[i].held)), fmt.Sprintf("%.2f", mean(res[i].rts)), fmt.Sprintf("%.1f", mean(res[i].cmds)),
				fmt.Sprintf("%.0f, %.0f", mean(res[i].rcpu), mean(res[i].wcpu)), topCalls(meanCalls(res[i]), 6))
		}
		most := maxRunning(ours)
		t.property(fmt.Sprintf("cap of %d never exceeded inside the handlers, %s (max seen: %d)", size, label, most), most <= size)
		return point{x: x, cmds: mean(ours.cmds), rcpu: mean(ours.rcpu)}, nil
	}

	// The number of processes: one pool of 30 slots over 3, 10 and 30
	// processes, against 30 raw servers' worth of the same slots.
	const slots = 30
	for _, p := range []int{3, 10, 30} {
		split := make([]int, p)
		for i := range split {
			split[i] = slots / p
		}
		pt, err := run(fmt.Sprintf("%d processes", p), float64(p), p, slots, split)
		if err != nil {
			return nil, err
		}
		byProcs = append(byProcs, pt)
	}
	// The pool's size: 10, 100 and 1,000 slots over 3 processes.
	for _, size := range []int{10, 100, 1000} {
		split := []int{size - 2*(size/3), size / 3, size / 3}
		pt, err := run(fmt.Sprintf("pool size %d", size), float64(size), 3, size, split)
		if err != nil {
			return nil, err
		}
		bySize = append(bySize, pt)
	}

	slope := func(ps []point, f func(point) float64) float64 {
		var sx, sy, sxx, sxy float64
		for _, p := range ps {
			sx, sy, sxx, sxy = sx+p.x, sy+f(p), sxx+p.x*p.x, sxy+p.x*f(p)
		}
		n := float64(len(ps))
		return (n*sxy - sx*sy) / (n*sxx - sx*sx)
	}
	cmds := func(p point) float64 { return p.cmds }
	rcpu := func(p point) float64 { return p.rcpu }
	first, last := byProcs[0], byProcs[len(byProcs)-1]
	t.note("slope, cluster cap, by processes (3 -> 30, pool of %d): %+.3f commands per job and %+.2f µs of Redis CPU per job per added process (commands/job %.1f at 3, %.1f at 30)",
		slots, slope(byProcs, cmds), slope(byProcs, rcpu), first.cmds, last.cmds)
	sf, sl := bySize[0], bySize[len(bySize)-1]
	t.note("slope, cluster cap, by pool size (10 -> 1,000, 3 processes): %+.3f commands per job and %+.2f µs of Redis CPU per job per 100 added slots (commands/job %.1f at 10, %.1f at 1,000)",
		100*slope(bySize, cmds), 100*slope(bySize, rcpu), sf.cmds, sl.cmds)
	// Every count of processes, not only the last: the cost must not grow
	// on the way either.
	worst := 0.0
	var ratios []string
	for _, p := range byProcs[1:] {
		worst = max(worst, p.cmds/first.cmds)
		ratios = append(ratios, fmt.Sprintf("%.2fx at %.0f", p.cmds/first.cmds, p.x))
	}
	t.target(fmt.Sprintf("commands per job at 10 and 30 processes <= 1.15x at 3 (%s)", strings.Join(ratios, ", ")), worst <= 1.15)
	t.target(fmt.Sprintf("commands per job at pool size 1,000 <= 1.15x at 10 (%.2fx)", sl.cmds/sf.cmds), sl.cmds <= 1.15*sf.cmds)
	t.note("%d round(s) per setup, raw and cluster alternating which goes first; each figure is the mean of the rounds, the ratio the median of the rounds' throughput against the static split measured beside it; commands/job counts the commands inside scripts (INFO), and so do the most frequent commands (INFO commandstats; evalsha is the script call itself)", rounds)
	t.note("busy slots: jobs inside their handlers from the first start to the last, divided by the slots; a pool whose slots are nearly all busy is full, and its jobs wait for slots through Redis; ms in handler: the mean time a job spent inside its handler, its sleep plus the delay before the Go runtime ran it again after its timer fired; throughput is busy slots divided by it, so it moves the ratios as much as busy slots do")
	t.note("Redis CPU µs/job: INFO cpu (user + system) over the drain, divided by jobs; its inverse is the most jobs per second one Redis core could carry for that setup")
	return t, nil
}

// meanCalls averages a setup's per-command breakdown over its rounds.
func meanCalls(r *capResult) map[string]float64 {
	out := map[string]float64{}
	for _, c := range r.calls {
		for name, v := range maps.All(c) {
			out[name] += v / float64(len(r.calls))
		}
	}
	return out
}
