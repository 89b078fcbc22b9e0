package queues

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// ErrInvalidRequest is matched by an enqueue refused for what was asked: a
// job type routed to no pool, a tier its pool does not serve. Nothing was
// enqueued.
var ErrInvalidRequest = errors.New("invalid enqueue request")

// Client is the engine's front door. It enqueues jobs into their pool's
// queues (routing a job type to its pool and a tier to its queue) and, when
// its Config has Handlers, runs the pools: one asynq.Server per pool, each
// a bulkhead of its own size.
//
// A Client is safe for concurrent use. It does not own the Redis client it
// is given and never closes it; Stop stops what Start started.
type Client struct {
	cfg  Config // defaults filled
	rdb  redis.UniversalClient
	ks   rdb.Keyspace             // the queue names and keys for rdb's topology
	reg  atomic.Pointer[registry] // the pools now; Reconfigure swaps it
	aq   *asynq.Client
	insp *asynq.Inspector
	run  *runner  // nil without Handlers
	tr   *tracing // nil when tracing is off (Config.TracerProvider)

	jobs      *rdb.Jobs // the enqueue side's scripts and commands
	runs      *rdb.Runs // runs' records
	door      doorGroup
	published sync.Map // queues asynq's set of queue names has, as far as we wrote them

	reconfiguring sync.Mutex // Reconfigure, one at a time
}

// NewClient validates cfg (on a copy with its defaults filled; cfg itself
// is not changed) and returns a client over rdb. Every problem of cfg is
// returned at once, as a *ConfigError. Nothing talks to Redis until the
// first enqueue or Start.
func NewClient(rc redis.UniversalClient, cfg Config) (*Client, error) {
	if rc == nil {
		return nil, errors.New("queues: NewClient: nil Redis client")
	}
	cfg = cfg.WithDefaults()
	if problems := cfg.Problems(); len(problems) > 0 {
		return nil, &ConfigError{Problems: problems}
	}
	ks := rdb.KeyspaceFor(cfg.Namespace, rc)
	pools, err := newRegistry(cfg, ks, nil)
	if err != nil {
		return nil, err
	}
	c := &Client{
		cfg: cfg, rdb: rc, ks: ks, tr: newTracing(cfg),
		aq:   asynq.NewClientFromRedisClient(rc),
		insp: asynq.NewInspectorFromRedisClient(rc),
		jobs: rdb.NewJobs(rc, ks, backlogRecount),
		runs: rdb.NewRuns(rc, ks, RunKeep),
	}
	c.reg.Store(pools)
	if cfg.Handlers != nil {
		c.run = newRunner(c)
	}
	return c, nil
}

// Namespace returns the namespace of the client's queues and keys.
func (c *Client) Namespace() string { return c.cfg.Namespace }

// pools returns the pools in effect.
func (c *Client) pools() *registry { return c.reg.Load() }

// Pools returns the pools in configuration order.
func (c *Client) Pools() []*Pool { return append([]*Pool(nil), c.pools().pools...) }

// Pool returns the pool called name.
func (c *Client) Pool(name string) (*Pool, error) { return c.pools().get(name) }

// Route returns the pool a job type is routed to.
func (c *Client) Route(jobType string) (*Pool, error) { return c.pools().route(jobType) }

// EnqueueOptions refine one enqueue. The zero value enqueues a job now, at
// its pool's default tier, with a random ID.
type EnqueueOptions struct {
	// Tier is the priority tier, for a pool with tiers. Defaults to the
	// policy's default tier. Must be empty for a pool without tiers.
	Tier string
	// ID makes the job unique in its pool: while a job with this ID is
	// pending, scheduled, running or waiting for a retry in any of the
	// pool's tiers, enqueuing it again adds nothing (Outcome Duplicate).
	// A finished job with the ID (completed and kept for Retention, or
	// archived) is replaced (Outcome Replaced). Defaults to a random ID.
	ID string
	// ProcessIn delays the job. Defaults to 0 (ready now).
	ProcessIn time.Duration
	// Retention keeps the finished job visible (as completed) for this long.
	// Defaults to 0 (deleted when done).
	Retention time.Duration
	// RateKey names the caller (a requester, a tenant) for the pool's
	// enqueue_rate_per_key limit; ignored by a pool without one. Empty: the
	// request is not limited per key (only by the pool's other door
	// settings), so a caller that must be limited has to name itself. At
	// most 128 printable characters.
	RateKey string

	// run is the run the job belongs to (Run.EnqueueMany sets it): it goes
	// in the job's headers (rdb.RunHeader).
	run string
}

// maxRateKey bounds EnqueueOptions.RateKey.
const maxRateKey = 128

func rateKeyProblem(k string) string {
	if len(k) > maxRateKey {
		return fmt.Sprintf("rate key is %d bytes long, at most %d", len(k), maxRateKey)
	}
	for _, r := range k {
		if !unicode.IsPrint(r) {
			return fmt.Sprintf("rate key %q has a character that is not printable", k)
		}
	}
	return ""
}

// Request is one job to enqueue with EnqueueMany. Job.Request builds a
// typed one.
type Request struct {
	JobType string
	Payload []byte
	Options EnqueueOptions
}

// EnqueueOutcome says what an enqueue did with one job (a JobOutcome says
// how a pool was done with a job it ran).
type EnqueueOutcome int

// Outcome is the former name of EnqueueOutcome.
//
// Deprecated: use EnqueueOutcome, which cannot be confused with JobOutcome.
type Outcome = EnqueueOutcome

const (
	// Enqueued: a new job was added.
	Enqueued EnqueueOutcome = iota
	// Duplicate: a job with the same ID is pending, scheduled, running or
	// waiting for a retry in the pool; nothing was added.
	Duplicate
	// Replaced: a finished job with the same ID (completed or archived) was
	// replaced by a new one.
	Replaced
	// NotEnqueued: EnqueueMany returned an error before this job was
	// enqueued, and nothing was added for it (see EnqueueMany for the one
	// case where that cannot be known for sure). Only with an error.
	NotEnqueued
)

func (o EnqueueOutcome) String() string {
	switch o {
	case Enqueued:
		return "enqueued"
	case Duplicate:
		return "duplicate"
	case Replaced:
		return "replaced"
	case NotEnqueued:
		return "not enqueued"
	}
	return "EnqueueOutcome(" + strconv.Itoa(int(o)) + ")"
}

// EnqueueResult says where a job went.
type EnqueueResult struct {
	// ID is the job's ID.
	ID string
	// Queue and Tier say where the job is: for a Duplicate, where the job
	// that was already there is.
	Queue string
	Tier  string
	// Outcome says whether a job was added.
	Outcome EnqueueOutcome
}

// Enqueue puts one job of jobType into its pool's queue for the tier. For
// typed payloads, use the package function Enqueue with a Job.
func (c *Client) Enqueue(ctx context.Context, jobType string, payload []byte, o EnqueueOptions) (EnqueueResult, error) {
	res, err := c.EnqueueMany(ctx, []Request{{JobType: jobType, Payload: payload, Options: o}})
	if err != nil {
		return EnqueueResult{}, err
	}
	return res[0], nil
}

// enqueueLockTTL bounds how long a crashed client can hold a job ID's lock;
// a batch stops enqueuing enqueueLockMargin before its locks expire.
const (
	enqueueLockTTL    = 60 * time.Second
	enqueueLockMargin = 10 * time.Second
)

// enqueueParallel bounds how many queues EnqueueMany fills at once.
const enqueueParallel = 8

// EnqueueMany enqueues a batch of jobs, for example a month-end plan. It
// returns one result per request, in the order of reqs.
//
// Every request is checked first: if any is invalid (a job type routed to
// no pool, a tier its pool does not serve), the error matches
// ErrInvalidRequest, lists every problem, nothing is enqueued and the
// results are nil.
//
// Jobs with an ID are unique in their pool (see EnqueueOptions.ID): all of
// the batch's IDs are locked and looked up in a few Redis calls, so two
// clients enqueuing the same ID at once add it once. Within one queue, jobs
// are enqueued in the order given, one after the other, so they also start
// in that order; different queues are filled in parallel.
//
// Jobs of pools with a door (max_backlog, enqueue rates) are checked and
// written in one Redis step before the rest of the batch: if the door
// refuses, nothing of the batch is enqueued and the error matches
// ErrRefused (a *BacklogError or a *RateLimitError that says how much room
// there was, or when to retry). See docs/DOOR.md. On a Redis Cluster
// that step is one per pool: a refusal takes back what the earlier pools
// admitted, except a job a worker started in between (the error says so;
// docs/CLUSTER.md, "On a Redis Cluster").
//
// On any error after the checks (a refusal, Redis failing, ctx ending,
// the batch outlasting its locks) EnqueueMany stops and returns the error
// with the results so far: the jobs enqueued before it stay queued and
// their results say Enqueued or Replaced (a Duplicate names a job that was
// there already), and every job it did not enqueue says NotEnqueued, so
// enqueuing those requests again finishes the batch. A job of a pool without a door whose own call
// to Redis was the one that failed is NotEnqueued too, though Redis may
// have written it if only the reply was lost (a timeout): with an ID,
// enqueuing it again is safe either way.
func (c *Client) EnqueueMany(ctx context.Context, reqs []Request) ([]EnqueueResult, error) {
	b, err := c.route(reqs)
	if err != nil {
		return nil, err
	}
	b.trace = c.tr.startEnqueue(ctx, b)
	err = b.enqueue(ctx)
	b.settleRepeats()
	b.trace.end(b, err)
	return b.results, err
}

// batch is one EnqueueMany call as it goes through its phases: route
// (c.route), then lock and find the unique IDs, admit the door's jobs,
// replace finished jobs and enqueue the rest (enqueue), then report
// (settleRepeats).
type batch struct {
	c       *Client
	reqs    []Request
	pools   []*Pool
	results []EnqueueResult // each NotEnqueued until its job is written
	trace   *enqueueSpans   // the jobs' spans and trace headers; nil without tracing

	// repeats maps a job whose ID an earlier job of the batch has in the
	// same pool to that earlier job: it is that job's Duplicate.
	repeats map[int]int
	// unique are the jobs whose IDs are locked, replaces the finished
	// jobs some of them replace.
	unique   []int
	replaces map[int]*rdb.FinishedJob
	// The enqueue locks held, their token, and when they were taken.
	held     []rdb.LockJob
	token    string
	lockedAt time.Time
}

// route checks every request and routes each to its pool and queue.
func (c *Client) route(reqs []Request) (*batch, error) {
	b := &batch{c: c, reqs: reqs, pools: make([]*Pool, len(reqs)), results: make([]EnqueueResult, len(reqs))}
	var bad []string
	reg := c.pools() // one view of the pools for the whole batch
	for i, r := range reqs {
		p, err := reg.route(r.JobType)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		tier := r.Options.Tier
		if tier == "" && p.tiers != nil {
			tier = reg.tiers.Default()
		}
		queue, err := p.QueueFor(tier)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		if msg := rateKeyProblem(r.Options.RateKey); msg != "" {
			bad = append(bad, msg)
			continue
		}
		b.pools[i] = p
		b.results[i] = EnqueueResult{ID: r.Options.ID, Queue: queue, Tier: tier, Outcome: NotEnqueued}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%w: %s; nothing was enqueued", ErrInvalidRequest, strings.Join(bad, "; "))
	}
	return b, nil
}

// enqueue runs the batch's phases after routing, and stops at the first
// error.
func (b *batch) enqueue(ctx context.Context) error {
	b.findRepeats()
	if len(b.unique) > 0 {
		if err := b.lockAndFind(ctx); err != nil {
			return err
		}
		defer b.unlock(ctx)
	}
	if err := b.admitDoor(ctx); err != nil {
		return err
	}
	if err := b.replaceFinished(ctx); err != nil {
		return err
	}
	return b.enqueueStreams(ctx)
}

// findRepeats marks a job whose ID an earlier job of the batch has in the
// same pool as that job's Duplicate, and lists the first of each ID as
// unique.
func (b *batch) findRepeats() {
	type poolID struct {
		pool *Pool
		id   string
	}
	first := map[poolID]int{}
	for i, r := range b.reqs {
		if r.Options.ID == "" {
			continue
		}
		key := poolID{b.pools[i], r.Options.ID}
		if j, ok := first[key]; ok {
			if b.repeats == nil {
				b.repeats = map[int]int{}
			}
			b.repeats[i] = j
			b.results[i].Outcome = Duplicate
			continue
		}
		first[key] = i
		b.unique = append(b.unique, i)
	}
}

// settleRepeats gives each repeated ID the outcome of its first: a
// Duplicate of where that job is, or NotEnqueued with it.
func (b *batch) settleRepeats() {
	for i, j := range b.repeats {
		b.results[i].Queue, b.results[i].Tier = b.results[j].Queue, b.results[j].Tier
		if b.results[j].Outcome == NotEnqueued {
			b.results[i].Outcome = NotEnqueued
		} else {
			b.results[i].Outcome = Duplicate
		}
	}
}

// lockAndFind takes the enqueue lock of each unique job, waiting up to
// enqueueLockTTL for locks another client holds, and notes where each
// already exists in its pool: a job waiting or running there is a
// Duplicate, a finished one is replaced. On an error it has released the
// locks it took.
func (b *batch) lockAndFind(ctx context.Context) error {
	c := b.c
	b.token, b.lockedAt = newLockToken(), time.Now()
	jobs := make([]rdb.LockJob, len(b.unique))
	for k, i := range b.unique {
		p := b.pools[i]
		jobs[k] = rdb.LockJob{Pool: p.Name(), ID: b.reqs[i].Options.ID, Queues: p.queues, Breaker: p.cfg.Breaker != nil}
	}
	waiting := make([]int, len(jobs)) // positions in jobs
	for k := range waiting {
		waiting[k] = k
	}
	deadline := time.Now().Add(enqueueLockTTL)
	for {
		var still []int
		// On a cluster, one call per pool: its keys share the pool's slot.
		for _, group := range slotGroups(c.ks, waiting, func(k int) string { return jobs[k].Pool }) {
			part := make([]rdb.LockJob, len(group))
			for n, k := range group {
				part[n] = jobs[k]
			}
			found, err := c.jobs.LockAndFind(ctx, b.token, enqueueLockTTL, part)
			if err != nil {
				// The script may have taken some of these locks: release
				// them all (only ours are deleted).
				b.held = append(b.held, part...)
				b.unlock(ctx)
				return err
			}
			for n, k := range group {
				if found[n].Locked {
					still = append(still, k)
					continue
				}
				b.held = append(b.held, jobs[k])
				b.found(b.unique[k], found[n])
			}
		}
		if len(still) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			b.unlock(ctx)
			return fmt.Errorf("enqueue lock for job %q: still held after %s by another client", jobs[still[0]].ID, enqueueLockTTL)
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			b.unlock(ctx)
			return ctx.Err()
		case <-t.C:
		}
		waiting = still
	}
}

// found notes what the lookup found for job i.
func (b *batch) found(i int, f rdb.Lookup) {
	switch {
	case f.Queue == "":
	case f.State == "completed" || f.State == "archived":
		if b.replaces == nil {
			b.replaces = map[int]*rdb.FinishedJob{}
		}
		b.replaces[i] = &rdb.FinishedJob{Queue: f.Queue, State: f.State}
	default:
		b.results[i].Outcome = Duplicate
		b.results[i].Queue, b.results[i].Tier = f.Queue, b.pools[i].TierOf(f.Queue)
	}
}

// unlock releases the enqueue locks the batch holds. A lock it cannot
// release lapses by itself after enqueueLockTTL; until then another
// client enqueuing the same ID waits for it: that is logged, not
// returned, since the batch's own jobs are where their results say.
func (b *batch) unlock(ctx context.Context) {
	bg := context.WithoutCancel(ctx)
	for _, g := range slotGroups(b.c.ks, b.held, func(l rdb.LockJob) string { return l.Pool }) {
		if _, err := b.c.jobs.Unlock(bg, b.token, g); err != nil {
			b.c.cfg.Logger.Warn("enqueue: job ID locks not released; enqueues of the same IDs wait until they lapse",
				"locks", len(g), "pool", g[0].Pool, "lapse", enqueueLockTTL, "err", err)
		}
	}
	b.held = nil
}

// lockHeld fails once the batch's locks may have expired: past that,
// another client could pass the same check. It stops well before.
func (b *batch) lockHeld() error {
	if !b.lockedAt.IsZero() && time.Since(b.lockedAt) > enqueueLockTTL-enqueueLockMargin {
		return fmt.Errorf("enqueue: the batch took longer than its locks last (%s); the jobs enqueued so far stay, enqueue the rest again", enqueueLockTTL-enqueueLockMargin)
	}
	return nil
}

// admitDoor checks and writes the jobs of pools with a door in one step,
// all or nothing, before anything else of the batch is written.
func (b *batch) admitDoor(ctx context.Context) error {
	var door []doorJob
	for i := range b.reqs {
		if b.results[i].Outcome != Duplicate && b.pools[i].cfg.HasDoor() {
			door = append(door, doorJob{i: i, replaces: b.replaces[i]})
		}
	}
	if len(door) == 0 {
		return nil
	}
	if err := b.c.admit(ctx, &doorRequest{reqs: b.reqs, pools: b.pools, results: b.results, jobs: door, trace: b.trace}); err != nil {
		return err
	}
	for _, j := range door {
		if j.replaces != nil && b.results[j.i].Outcome == Replaced {
			b.clearFailures(ctx, j.i)
		}
	}
	return nil
}

// replaceFinished deletes the finished jobs that jobs of pools without a
// door replace (the door's script replaces its own in its step).
func (b *batch) replaceFinished(ctx context.Context) error {
	for i, f := range b.replaces {
		if b.pools[i].cfg.HasDoor() {
			continue
		}
		if err := b.c.insp.DeleteTask(f.Queue, b.reqs[i].Options.ID); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
			return fmt.Errorf("replace finished job %q: %w", b.reqs[i].Options.ID, err)
		}
		b.clearFailures(ctx, i)
	}
	return nil
}

// clearFailures deletes the failure counts of the finished job that job
// i replaces: the new job starts with none.
func (b *batch) clearFailures(ctx context.Context, i int) {
	id := b.reqs[i].Options.ID
	_ = rdb.NewFailureCounts(b.c.rdb, b.c.ks, b.pools[i].Name()).Clear(ctx,
		rdb.Member{ID: id, Queue: b.replaces[i].Queue}, rdb.Member{ID: id, Queue: b.results[i].Queue})
}

// enqueueStreams enqueues the jobs of pools without a door through asynq,
// in streams of jobs enqueued one after the other (streams). Streams run in
// parallel; when one fails, the others stop after the job they are on, so
// that every job's result says whether it was written.
func (b *batch) enqueueStreams(ctx context.Context) error {
	streams := b.streams()
	if len(streams) == 0 {
		return nil
	}
	var g errgroup.Group
	g.SetLimit(enqueueParallel)
	var failed atomic.Bool
	for _, st := range streams {
		g.Go(func() error {
			for _, i := range st {
				if failed.Load() {
					return nil
				}
				err := b.lockHeld()
				if err == nil {
					err = b.enqueueOne(ctx, i)
				}
				if err != nil {
					failed.Store(true)
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// streams returns the jobs to enqueue through asynq, by stream: one per
// queue, except that a strict pool's tiers form one stream, highest tier
// first, so that no worker starts a lower tier's job of the batch while a
// higher tier's is still to come.
func (b *batch) streams() [][]int {
	streamOf := map[string]int{}
	var streams [][]int
	for i := range b.reqs {
		if b.results[i].Outcome == Duplicate || b.pools[i].cfg.HasDoor() {
			continue
		}
		key := b.results[i].Queue
		if b.pools[i].tiers != nil && b.pools[i].cfg.QueueOrder == QueueOrderStrict {
			key = "pool:" + b.pools[i].Name()
		}
		k, ok := streamOf[key]
		if !ok {
			k = len(streams)
			streamOf[key] = k
			streams = append(streams, nil)
		}
		streams[k] = append(streams[k], i)
	}
	for _, st := range streams {
		sort.SliceStable(st, func(x, y int) bool {
			return b.pools[st[x]].rank(b.results[st[x]].Queue) < b.pools[st[y]].rank(b.results[st[y]].Queue)
		})
	}
	return streams
}

// enqueueOne enqueues job i through asynq.
func (b *batch) enqueueOne(ctx context.Context, i int) error {
	req, res := b.reqs[i], &b.results[i]
	task := asynq.NewTaskWithHeaders(req.JobType, req.Payload, jobHeaders(time.Now(), req.Options, b.trace.of(i)))
	info, err := b.c.aq.EnqueueContext(ctx, task, b.c.options(b.pools[i], res.Queue, req.Options)...)
	switch {
	case errors.Is(err, asynq.ErrTaskIDConflict):
		// Enqueued meanwhile by something that does not take the lock
		// (asynq's own tools, say); where it is, is not known here: Queue
		// and Tier say where it was asked for.
		res.Outcome = Duplicate
	case err != nil:
		return fmt.Errorf("enqueue %s: %w", req.JobType, err)
	default:
		res.ID, res.Outcome = info.ID, Enqueued
		if b.replaces[i] != nil {
			res.Outcome = Replaced
		}
	}
	return nil
}

// options are the asynq options of a job of pool p in queue q.
func (c *Client) options(p *Pool, q string, o EnqueueOptions) []asynq.Option {
	// asynq counts a worker crash as a retry; the runner counts real
	// failures against max_retry itself, so asynq's limit leaves room for
	// CrashRetries crashes on top (see runner.countFailure).
	opts := []asynq.Option{asynq.Queue(q), asynq.MaxRetry(p.cfg.retries() + CrashRetries), asynq.Timeout(p.cfg.JobTimeout)}
	if o.ID != "" {
		opts = append(opts, asynq.TaskID(o.ID))
	}
	if o.ProcessIn > 0 {
		opts = append(opts, asynq.ProcessIn(o.ProcessIn))
	}
	if o.Retention > 0 {
		opts = append(opts, asynq.Retention(o.Retention))
	}
	return opts
}

// newLockToken returns a random value that tells this call's locks from
// another client's.
func newLockToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Exists reports, for each ID, whether the pool jobType is routed to holds
// a job with that ID, in any of its tiers and in any state: pending,
// scheduled, running, waiting for a retry, or finished and still kept
// (completed within its Retention, or archived). One pipelined round trip.
func (c *Client) Exists(ctx context.Context, jobType string, ids []string) ([]bool, error) {
	p, err := c.pools().route(jobType)
	if err != nil {
		return nil, err
	}
	return c.jobs.Exists(ctx, p.queues, ids)
}
