// Package metrics exports a queues.Client's pools, tiers and jobs to
// Prometheus (github.com/prometheus/client_golang). The engine knows
// nothing of Prometheus: Metrics is a queues.Observer for the job counts
// and histograms, a queues.Config.OnBreakerChange hook (BreakerChanged)
// for the circuit breakers' changes of state, and a collector that reads
// the pools' queues and cluster-wide slots from Redis when Prometheus
// scrapes, in one pipelined round trip (see queues.Client.Stats) whatever
// the backlog, and the RecentRuns most recent runs' states in two more
// (queues.Client.Runs).
//
//	m := metrics.New()
//	client, _ := queues.NewClient(rdb, queues.Config{..., Observer: m, OnBreakerChange: m.BreakerChanged})
//	m.Watch(client)
//	http.Handle("/metrics", m.Handler())
//
// Every name starts with compartment_; pools and tiers are the labels pool
// and tier (tier is empty for a pool without tiers).
package metrics

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lci-labs/compartment/queues"
)

// ScrapeTimeout bounds the Redis reads of one scrape.
const ScrapeTimeout = 5 * time.Second

// RecentRuns is how many runs compartment_runs counts: the most recently
// started ones (queues.Client.Runs).
const RecentRuns = 100

// runStates are the states compartment_runs has a series for, each from
// the start.
var runStates = []string{queues.RunOpen, queues.RunRunning, queues.RunCancelling, queues.RunSucceeded, queues.RunFailed, queues.RunCancelled, queues.RunRefused}

// Buckets of the wait and run time histograms, in seconds: from 5 ms (a
// pool that picks work up at once) to an hour (a month-end backlog).
var Buckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

// Metrics holds the job metrics a queues.Client reports through its
// Observer, and, once Watch is called, the pools' and queues' state read at
// scrape time. It is safe for concurrent use.
type Metrics struct {
	reg         *prometheus.Registry
	jobs        *prometheus.CounterVec
	wait        *prometheus.HistogramVec
	run         *prometheus.HistogramVec
	transitions *prometheus.CounterVec
	recovered   *prometheus.CounterVec
}

var _ queues.Observer = (*Metrics)(nil)

// New returns Metrics with its own registry, which also holds the Go
// runtime and process collectors.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compartment_jobs_total",
			Help: "Jobs a pool was done with in this process, by outcome: succeeded, retried (failed, will run again), archived (failed for good), requeued (did not run to its end through no fault of its own, back in its queue).",
		}, []string{"pool", "tier", "outcome"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "compartment_job_wait_seconds",
			Help:    "Time from a job being ready (enqueued, or its delay over) to its first start, for jobs started in this process.",
			Buckets: Buckets,
		}, []string{"pool", "tier"}),
		run: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "compartment_job_run_seconds",
			Help:    "Time a job's handler ran in this process, every attempt.",
			Buckets: Buckets,
		}, []string{"pool", "tier"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compartment_breaker_transitions_total",
			Help: "Changes of the circuit breaker's state made by this process (each change is made, and counted, by one process: sum over the workers; a change forced from the enqueue command is counted by none).",
		}, []string{"pool", "from", "to"}),
		recovered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "compartment_jobs_recovered_total",
			Help: "Jobs this process put back at the head of their queue because the worker process running them stopped answering (their lease went unrenewed for recover_after): sum over the workers.",
		}, []string{"pool"}),
	}
	m.reg.MustRegister(m.jobs, m.wait, m.run, m.transitions, m.recovered,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// JobStarted implements queues.Observer.
func (m *Metrics) JobStarted(s queues.JobStart) {
	if s.WaitKnown {
		m.wait.WithLabelValues(s.Pool, s.Tier).Observe(s.Wait.Seconds())
	}
}

// JobFinished implements queues.Observer.
func (m *Metrics) JobFinished(e queues.JobEnd) {
	m.jobs.WithLabelValues(e.Pool, e.Tier, string(e.Outcome)).Inc()
	if e.Started {
		m.run.WithLabelValues(e.Pool, e.Tier).Observe(e.Run.Seconds())
	}
}

// BreakerChanged counts a change of a pool's circuit breaker
// (compartment_breaker_transitions_total). Set it as the client's
// queues.Config.OnBreakerChange; it is quick and never blocks.
func (m *Metrics) BreakerChanged(c queues.BreakerChange) {
	m.transitions.WithLabelValues(c.Pool, string(c.From), string(c.To)).Inc()
}

// Recovered counts jobs this process took back from a worker process that
// stopped answering (compartment_jobs_recovered_total). Set it as the
// client's queues.Config.OnRecover; it is quick and never blocks.
func (m *Metrics) Recovered(r queues.Recovery) {
	m.recovered.WithLabelValues(r.Pool).Add(float64(len(r.Jobs)))
}

// breakerTransitions are the changes a breaker can make: closed to open
// (a trip, or forced), open to half-open (the cool-down's end), half-open
// to closed or open (the probes' verdict, or forced), open to closed
// (forced close or reset).
var breakerTransitions = [][2]queues.BreakerStatus{
	{queues.BreakerClosed, queues.BreakerOpen},
	{queues.BreakerOpen, queues.BreakerHalfOpen},
	{queues.BreakerHalfOpen, queues.BreakerClosed},
	{queues.BreakerHalfOpen, queues.BreakerOpen},
	{queues.BreakerOpen, queues.BreakerClosed},
}

// Watch adds c's pools and queues to the metrics: their state is read
// when Prometheus scrapes, and every pool's and tier's job series (and
// every breaker's transition series) start at zero, so rates and alerts
// work before the first job. Call it once per client; c's Config.Observer
// should be m and its Config.OnBreakerChange m.BreakerChanged, or those
// series stay at zero.
func (m *Metrics) Watch(c *queues.Client) error {
	for _, p := range c.Pools() {
		if p.Config().Breaker != nil {
			for _, t := range breakerTransitions {
				m.transitions.WithLabelValues(p.Name(), string(t[0]), string(t[1]))
			}
		}
		m.recovered.WithLabelValues(p.Name())
		tiers := p.Tiers()
		if tiers == nil {
			tiers = []string{""}
		}
		for _, t := range tiers {
			for _, o := range queues.JobOutcomes {
				m.jobs.WithLabelValues(p.Name(), t, string(o))
			}
			m.wait.WithLabelValues(p.Name(), t)
			m.run.WithLabelValues(p.Name(), t)
		}
	}
	return m.reg.Register(newCollector(c))
}

// Registry returns the registry, to add your own collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in Prometheus's text format. A scrape whose
// Redis reads fail still serves the process's own metrics, with
// compartment_redis_up at 0.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// collector reads a client's pools and queues at scrape time.
type collector struct {
	c *queues.Client

	up, size, inUse, clusterInUse, full         *prometheus.Desc
	gateWaits, gateWaitTime                     *prometheus.Desc
	pending, active, scheduled, retry           *prometheus.Desc
	waitingForSlot, workersCanRun               *prometheus.Desc
	usefulWorkers                               *prometheus.Desc
	archived, oldest, paused, scrapeTaken       *prometheus.Desc
	backlogLimit, refused, waitingForRoom       *prometheus.Desc
	breakerState, breakerTrips                  *prometheus.Desc
	reserved, maxWait                           *prometheus.Desc
	runs                                        *prometheus.Desc
	adaptiveLimit, adaptiveMin, adaptiveChanges *prometheus.Desc
	depCapacity, depClaimed, depInUse           *prometheus.Desc
}

func newCollector(c *queues.Client) *collector {
	pool := []string{"pool"}
	queue := []string{"pool", "tier"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &collector{
		c:              c,
		up:             d("compartment_redis_up", "1 when this scrape read the queues from Redis, 0 when Redis failed (the queue and cluster metrics are then missing).", nil),
		scrapeTaken:    d("compartment_redis_scrape_seconds", "How long this scrape's Redis reads took (one pipelined round trip).", nil),
		size:           d("compartment_pool_size", "The pool's size in effect: the most jobs it runs at once (across every process for scope cluster, an operator's resize included; per process for scope process).", pool),
		inUse:          d("compartment_pool_slots_in_use", "Jobs of the pool running in this process (its bulkhead).", pool),
		clusterInUse:   d("compartment_pool_cluster_slots_in_use", "Slots of a cluster-scoped pool held across every worker process.", pool),
		full:           d("compartment_pool_full", "1 when the pool has no free slot: across processes for a cluster-scoped pool, in this process otherwise.", pool),
		gateWaits:      d("compartment_pool_gate_waits_total", "Jobs of a cluster-scoped pool that were dequeued before a slot was free and waited for one, in this process.", pool),
		gateWaitTime:   d("compartment_pool_gate_wait_seconds_total", "Total time those jobs waited for a slot, in this process.", pool),
		pending:        d("compartment_queue_pending", "Jobs ready to run in the tier's queue.", queue),
		active:         d("compartment_queue_active", "Jobs of the tier's queue whose handler runs, in every process (for a cluster-scoped pool: those holding a slot, never more than its size).", queue),
		waitingForSlot: d("compartment_queue_waiting_for_slot", "Jobs of the tier's queue a worker took ahead of a free cluster-wide slot (the look-ahead): not running, not in the backlog; they start as soon as a slot frees.", queue),
		workersCanRun:  d("compartment_pool_workers_can_run", "How many of a cluster-scoped pool's jobs the live worker processes can run at once between them (each its max_size); a size above it is not reached.", pool),
		usefulWorkers:  d("compartment_pool_useful_workers", "How many worker processes the pool's work can keep busy now: its running and ready jobs, at most its size in effect for scope cluster, over one process's max_size, rounded up (docs/AUTOSCALING.md). Every worker exports the same value: scale on the max over pools, not the sum.", pool),
		scheduled:      d("compartment_queue_scheduled", "Jobs of the tier's queue waiting for their start time.", queue),
		retry:          d("compartment_queue_retry", "Jobs of the tier's queue waiting to be retried after a failure.", queue),
		archived:       d("compartment_queue_archived", "Jobs of the tier's queue that failed for good (kept by asynq for 90 days, at most 10,000).", queue),
		oldest:         d("compartment_queue_oldest_pending_seconds", "How long the oldest pending job of the tier's queue has waited; 0 when none is pending.", queue),
		paused:         d("compartment_queue_paused", "1 when the tier's queue is paused, by the cluster-wide gate (pool full, or a higher tier has work) or by an operator.", queue),
		backlogLimit:   d("compartment_queue_backlog_limit", "The door's limit for the tier: its jobs are admitted only while the pool's backlog (pending, scheduled and retry in all tiers) is below it (pools with max_backlog).", queue),
		refused:        d("compartment_door_refused_total", "Jobs of the tier the pool's door refused, by reason (backlog, rate), by every producer on the Redis.", []string{"pool", "tier", "reason"}),
		waitingForRoom: d("compartment_door_waiting_requests", "Enqueue requests waiting for room in the pool's backlog (backlog_wait).", pool),
		breakerState:   d("compartment_breaker_state", "1 for the circuit breaker's current state (closed, open, half-open), 0 for the others (pools with a breaker).", []string{"pool", "state"}),
		reserved:       d("compartment_queue_reserved_slots", "The pool's slots reserved for the tier and the tiers above it (pools with reserved).", queue),
		maxWait:        d("compartment_queue_max_wait_seconds", "The tier's maximum wait: once its oldest pending job has waited longer, it is served before the higher tiers (pools with max_wait).", queue),
		breakerTrips:   d("compartment_breaker_trips", "The circuit breaker's openings in a row without a close (its cool-down doubles with each).", pool),
		runs: d("compartment_runs", fmt.Sprintf("Runs (tracked units of work, such as a month-end) among the %d most recently started, by state: open, running, cancelling, succeeded, failed, cancelled, refused.", RecentRuns),
			[]string{"state"}),
		adaptiveLimit:   d("compartment_pool_adaptive_limit", "An adaptive pool's limit now (its size in effect unless an operator's resize overrides it; compartment_pool_size says which holds).", pool),
		adaptiveMin:     d("compartment_pool_adaptive_min", "The lowest an adaptive pool's limit falls (adaptive.min).", pool),
		adaptiveChanges: d("compartment_pool_adaptive_changes_total", "Changes of an adaptive pool's limit, decided by any worker process; each is logged with its reason (status, the dashboard).", pool),
		depCapacity:     d("compartment_dependency_capacity", "A dependency's capacity: what the workers may hold of it at once.", []string{"dependency"}),
		depClaimed:      d("compartment_dependency_claimed", "What a pool claims of a dependency: its size in effect (an adaptive pool's max_size) times what one of its jobs uses.", []string{"dependency", "pool"}),
		depInUse:        d("compartment_dependency_in_use", "What a pool's running jobs hold of a dependency: its slots held across every worker process times what one job uses.", []string{"dependency", "pool"}),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.scrapeTaken, c.size, c.inUse, c.clusterInUse, c.full, c.gateWaits, c.gateWaitTime,
		c.pending, c.active, c.waitingForSlot, c.workersCanRun, c.usefulWorkers, c.scheduled, c.retry, c.archived, c.oldest, c.paused, c.backlogLimit, c.refused, c.waitingForRoom, c.breakerState, c.breakerTrips, c.reserved, c.maxWait, c.runs,
		c.adaptiveLimit, c.adaptiveMin, c.adaptiveChanges, c.depCapacity, c.depClaimed, c.depInUse} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ScrapeTimeout)
	defer cancel()
	start := time.Now()
	st, err := c.c.Stats(ctx)
	took := time.Since(start)
	if err != nil {
		gauge(c.up, 0)
	} else {
		gauge(c.up, 1)
		gauge(c.scrapeTaken, took.Seconds())
	}
	for _, p := range c.c.Pools() {
		name := p.Name()
		bh := p.Bulkhead().Stats()
		size := int64(p.Size())
		if p.Scope() == queues.ScopeCluster && err == nil {
			size = st.Sizes[name] // an operator may have resized it
		}
		gauge(c.size, float64(size), name)
		gauge(c.inUse, float64(bh.Active), name)
		full := int64(bh.Active) >= size
		if p.Scope() == queues.ScopeCluster && err == nil {
			held := st.ClusterSlots[name]
			gauge(c.clusterInUse, float64(held), name)
			gauge(c.workersCanRun, float64(st.Slots[name].Capacity), name)
			full = held >= size
		}
		if p.Scope() == queues.ScopeProcess || err == nil {
			gauge(c.full, b2f(full), name)
		}
		if err == nil {
			gauge(c.usefulWorkers, float64(st.UsefulWorkers[name]), name)
		}
		if gs, ok := c.c.GateStats(name); ok {
			ch <- prometheus.MustNewConstMetric(c.gateWaits, prometheus.CounterValue, float64(gs.Waits), name)
			ch <- prometheus.MustNewConstMetric(c.gateWaitTime, prometheus.CounterValue, gs.WaitTime.Seconds(), name)
		}
	}
	if err != nil {
		return
	}
	for _, q := range st.Queues {
		gauge(c.pending, float64(q.Pending), q.Pool, q.Tier)
		gauge(c.active, float64(q.Running), q.Pool, q.Tier)
		gauge(c.waitingForSlot, float64(q.WaitingForSlot), q.Pool, q.Tier)
		gauge(c.scheduled, float64(q.Scheduled), q.Pool, q.Tier)
		gauge(c.retry, float64(q.Retry), q.Pool, q.Tier)
		gauge(c.archived, float64(q.Archived), q.Pool, q.Tier)
		gauge(c.oldest, q.OldestPending.Seconds(), q.Pool, q.Tier)
		gauge(c.paused, b2f(q.Paused), q.Pool, q.Tier)
		if q.Reserved > 0 {
			gauge(c.reserved, float64(q.Reserved), q.Pool, q.Tier)
		}
		if q.MaxWait > 0 {
			gauge(c.maxWait, q.MaxWait.Seconds(), q.Pool, q.Tier)
		}
		if q.BacklogLimit > 0 {
			gauge(c.backlogLimit, float64(q.BacklogLimit), q.Pool, q.Tier)
		}
		if p, _ := c.c.Pool(q.Pool); p != nil && p.Config().HasDoor() {
			ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(q.RefusedBacklog), q.Pool, q.Tier, "backlog")
			ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(q.RefusedRate), q.Pool, q.Tier, "rate")
		}
	}
	for name, n := range st.WaitingForRoom {
		gauge(c.waitingForRoom, float64(n), name)
	}
	for name, b := range st.Breakers {
		for _, s := range queues.BreakerStatuses {
			gauge(c.breakerState, b2f(b.State == s), name, string(s))
		}
		gauge(c.breakerTrips, float64(b.Trips), name)
	}
	for name, a := range st.Adaptive {
		gauge(c.adaptiveLimit, float64(a.Limit), name)
		gauge(c.adaptiveMin, float64(a.Min), name)
		ch <- prometheus.MustNewConstMetric(c.adaptiveChanges, prometheus.CounterValue, float64(a.Changes), name)
	}
	for _, d := range st.Dependencies {
		gauge(c.depCapacity, float64(d.Capacity), d.Name)
		for _, u := range d.Pools {
			gauge(c.depClaimed, float64(u.Claimed), d.Name, u.Pool)
			gauge(c.depInUse, float64(u.InUse), d.Name, u.Pool)
		}
	}
	if runs, err := c.c.Runs(ctx, RecentRuns); err == nil {
		n := map[string]int{}
		for _, r := range runs {
			n[r.State]++
		}
		for _, s := range runStates {
			gauge(c.runs, float64(n[s]), s)
			delete(n, s)
		}
		for s, v := range n { // a state this package does not know yet
			gauge(c.runs, float64(v), s)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
