package app

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/queues"
)

// Status is the state of every pool and queue, read from Redis, so it sees
// every worker process.
type Status struct {
	Pools []PoolStatus `json:"pools"`
	// Schedules are the config's schedules with their next and last runs.
	Schedules []ScheduleStatus `json:"schedules,omitempty"`
}

// PoolStatus is one pool. Size is per worker process (asynq caps each
// process's server); Capacity is Size times the worker processes serving the
// pool now.
type PoolStatus struct {
	Name string `json:"name"`
	// Scope is "cluster" (Size holds across all worker processes) or
	// "process" (Size holds per process).
	Scope   string `json:"scope"`
	Size    int    `json:"size"`
	Workers int    `json:"workers"`
	// Capacity is Size for a cluster-scoped pool, Size × Workers otherwise.
	Capacity int `json:"capacity"`
	// Active counts jobs running: for a cluster-scoped pool, the slots held
	// across processes; otherwise the active jobs in its queues.
	Active    int  `json:"active"`
	Available int  `json:"available"`
	IsFull    bool `json:"is_full"`
	// Holders says which processes (host:pid:id) hold a cluster-scoped
	// pool's slots, and how many each.
	Holders map[string]int `json:"holders,omitempty"`
	Queues  []QueueStatus  `json:"queues"`
}

// QueueStatus is one asynq queue of a pool (one per tier).
type QueueStatus struct {
	Queue     string `json:"queue"`
	Tier      string `json:"tier,omitempty"`
	Pending   int    `json:"pending"`
	Active    int    `json:"active"`
	Scheduled int    `json:"scheduled"`
	Retry     int    `json:"retry"`
	Archived  int    `json:"archived"`
	Completed int    `json:"completed"`
	Paused    bool   `json:"paused"`
	// OldestPendingSeconds is how long the oldest pending job has waited.
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
}

// Status reads the pools' and queues' state.
func (e *Enqueuer) Status(ctx context.Context) (Status, error) {
	servers, err := e.Insp.Servers()
	if err != nil {
		return Status{}, err
	}
	var st Status
	for _, p := range e.Client.Pools() {
		ps := PoolStatus{Name: p.Name(), Size: p.Size(), Scope: string(p.Scope())}
		mine := map[string]bool{}
		for _, q := range p.Queues() {
			mine[q] = true
		}
		for _, s := range servers {
			if s.Status == "active" && servesAny(s.Queues, mine) {
				ps.Workers++
			}
		}
		tiers := p.Tiers()
		for i, q := range p.Queues() {
			qs := QueueStatus{Queue: q}
			if tiers != nil {
				qs.Tier = tiers[i]
			}
			info, err := e.Insp.GetQueueInfo(q)
			switch {
			case errors.Is(err, asynq.ErrQueueNotFound) || (err != nil && strings.Contains(err.Error(), "does not exist")):
				// Nothing was ever enqueued here: all zeros.
			case err != nil:
				return Status{}, err
			default:
				qs.Pending, qs.Active, qs.Scheduled = info.Pending, info.Active, info.Scheduled
				qs.Retry, qs.Archived, qs.Completed = info.Retry, info.Archived, info.Completed
				qs.Paused = info.Paused
				qs.OldestPendingSeconds = info.Latency.Round(time.Millisecond).Seconds()
			}
			ps.Active += qs.Active
			ps.Queues = append(ps.Queues, qs)
		}
		ps.Capacity = ps.Size * ps.Workers
		if p.Scope() == queues.ScopeCluster {
			active, holders, err := queues.ClusterSlots(ctx, e.Redis.Client, e.Client.Namespace(), p.Name())
			if err != nil {
				return Status{}, err
			}
			ps.Capacity, ps.Active, ps.Holders = ps.Size, active, holders
		}
		ps.Available = max(0, ps.Capacity-ps.Active)
		ps.IsFull = ps.Workers > 0 && ps.Available == 0
		st.Pools = append(st.Pools, ps)
	}
	if st.Schedules, err = e.Schedules(ctx, time.Now(), 0); err != nil {
		return Status{}, err
	}
	return st, nil
}

func servesAny(queues map[string]int, mine map[string]bool) bool {
	for q := range queues {
		if mine[q] {
			return true
		}
	}
	return false
}
