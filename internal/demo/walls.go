package demo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/queues"
)

// runWalls runs the same load on the runner: one asynq server per pool,
// each pool drawing connections only inside its share. With more, the
// worker goes on running for the third act, and the phase only waits for
// its jobs to leave the handlers; otherwise it stops the worker.
func runWalls(ctx context.Context, o Options, w *app.Worker, rec *recorder, plans []*reports.Plan, st *stage, more bool) (Phase, error) {
	cfg := o.Config
	res := Phase{
		Name:  "AFTER",
		Setup: "walls: " + poolSizes(cfg),
		Describe: fmt.Sprintf("one asynq server per pool (%s); each pool takes connections only inside its share of the %d",
			poolSizes(cfg), cfg.Database.MaxConnections),
	}
	enq, err := app.NewEnqueuerFor(cfg, w.Redis)
	if err != nil {
		return res, err
	}
	defer enq.Close()
	if err := w.Start(ctx); err != nil {
		return res, err
	}

	reportPool, err := w.Client.Route(handlers.TypeReport)
	if err != nil {
		return res, err
	}
	var rows []viewRow
	for _, p := range w.Client.Pools() {
		rows = append(rows, viewRow{key: p.Name(), label: p.Name(), size: p.Size()})
	}
	var jobs []app.ReportJob
	var states []app.JobState
	// Each period's plan is one run; its plan's on_complete (the month's
	// bundle) runs once its last report has ended.
	runs := make([]*app.PlanRun, len(plans))
	ph := &phase{
		view: &liveView{w: o.Out, terminal: o.Terminal, phase: res.Name, rows: rows, refresh: o.Refresh},
		rec:  rec,
		enqueueOrder: func(ctx context.Context, p handlers.OrderPayload) (string, error) {
			info, err := queues.Enqueue(ctx, enq.Client, handlers.Order, p, queues.EnqueueOptions{})
			return info.ID, err
		},
		enqueueSearch: func(ctx context.Context, p handlers.SearchPayload) error {
			_, err := queues.Enqueue(ctx, enq.Client, handlers.Search, p, queues.EnqueueOptions{})
			return err
		},
		flood: func(ctx context.Context) (int, error) {
			for i, p := range plans {
				r, err := enq.StartPlanRun(ctx, p)
				if err != nil {
					return 0, err
				}
				runs[i] = r
			}
			// Tier by tier, in monthEnd's order.
			for _, tier := range cfg.Policy.Tiers() {
				for i, p := range plans {
					var sub []reports.PlannedReport
					for _, e := range p.Entries {
						if e.Tier == tier {
							sub = append(sub, e)
						}
					}
					if len(sub) == 0 {
						continue
					}
					r, err := runs[i].Enqueue(ctx, sub)
					if err != nil {
						return len(jobs), err
					}
					jobs = append(jobs, r.Jobs...)
				}
			}
			for _, r := range runs {
				if err := r.Seal(ctx); err != nil {
					return len(jobs), err
				}
			}
			return len(jobs), nil
		},
		// Progress as the handlers see it, which costs no Redis calls (a
		// Redis poll per report and per refresh would take CPU from the
		// pools); once the handlers have seen every report end, the
		// queues' own states confirm it and give the failures' reasons.
		progress: func(ctx context.Context) (string, bool, error) {
			total := map[string]int{}
			for _, j := range jobs {
				total[j.Tier]++
			}
			ended, running := 0, 0
			var parts []string
			for _, tier := range cfg.Policy.Tiers() {
				if total[tier] == 0 {
					continue
				}
				done, failed, r := rec.reportCounts(tier, reportPool.Name())
				ended += done + failed
				running = r
				part := fmt.Sprintf("%s %d/%d", tier, done, total[tier])
				if failed > 0 {
					part += fmt.Sprintf(" (%d failed)", failed)
				}
				parts = append(parts, part)
			}
			line := fmt.Sprintf("%s; %d running", strings.Join(parts, ", "), running)
			if ended < len(jobs) {
				return line, false, nil
			}
			var err error
			if states, err = enq.Progress(ctx, jobs); err != nil {
				return "", false, err
			}
			for _, c := range app.CountByTier(states, cfg.Policy.Tiers()) {
				if !c.Finished() {
					return line, false, nil
				}
			}
			// Then each period's run ends, and its bundle is written.
			bundles, err := runsEnded(ctx, enq, cfg, plans, runs)
			if err != nil || !bundles {
				return line + "; the month-end's bundle runs", false, err
			}
			return line, true, nil
		},
		held:  w.DB.PeakConnections,
		db:    w.DB.SQL(),
		stage: st, title: res.Name + ": " + res.Setup,
	}
	ph.view.note("\n=== %s: %s ===\n%s", res.Name, res.Setup, res.Describe)
	times, err := ph.run(ctx, o)
	if err != nil {
		return res, err
	}
	if more {
		// The traffic has stopped: the last searches and the month-end's
		// bundles leave the handlers, so the counts below are whole.
		if err := idle(ctx, rec, drainLimit); err != nil {
			return res, err
		}
	} else if err := w.Stop(ctx); err != nil {
		return res, err
	}

	res.MonthEndTook, res.Enqueue = times.monthEnd, times.enqueue
	for i, r := range runs {
		if r == nil {
			continue
		}
		info, err := enq.Client.Run(ctx, r.ID())
		if err != nil {
			return res, err
		}
		line := fmt.Sprintf("month-end %s: run %s %s, %d/%d reports succeeded", info.Period, info.ID, info.State, info.Succeeded, info.Total())
		if plans[i].OnComplete != nil && plans[i].OnComplete.JobType == handlers.TypeBundle {
			line += "; bundle " + filepath.Join(cfg.OutputDir, handlers.ManifestName(plans[i].Period))
		}
		res.Runs = append(res.Runs, line)
	}
	res.OrderBefore, res.OrderDuring = rec.orderResults()
	res.ReportsTotal = len(jobs)
	for _, st := range states {
		if st.State == "completed" {
			res.ReportsDone++
			continue
		}
		res.ReportsFailed++
		res.Failures = append(res.Failures, fmt.Sprintf("%s %s: %s %s", st.Job.Report, st.Job.Period, st.State, cli.Readable(st.LastErr)))
	}
	peak, done := rec.peaks()
	conns := w.DB.PeakConnections()
	for _, p := range w.Client.Pools() {
		res.Pools = append(res.Pools, PoolResult{Name: p.Name(), Size: p.Size(), MaxConcurrent: peak[p.Name()], MaxConns: conns[p.Name()], Jobs: done[p.Name()]})
	}
	return res, nil
}

// runsEnded says whether every period's run has ended with its steps
// enqueued and, where its step is the month's bundle, the bundle written.
func runsEnded(ctx context.Context, enq *app.Enqueuer, cfg *app.Config, plans []*reports.Plan, runs []*app.PlanRun) (bool, error) {
	for i, r := range runs {
		if r == nil {
			continue
		}
		info, err := enq.Client.Run(ctx, r.ID())
		if err != nil {
			return false, err
		}
		if !info.Finished() || info.Due != "" {
			return false, nil
		}
		if s := plans[i].OnComplete; s != nil && s.JobType == handlers.TypeBundle && info.Fired != "" {
			if _, err := os.Stat(filepath.Join(cfg.OutputDir, handlers.ManifestName(plans[i].Period))); err != nil {
				return false, nil
			}
		}
	}
	return true, nil
}

func poolSizes(cfg *app.Config) string {
	parts := make([]string, len(cfg.Pools))
	for i, p := range cfg.Pools {
		parts[i] = fmt.Sprintf("%s %d", p.Name, p.Size)
	}
	return strings.Join(parts, ", ")
}
