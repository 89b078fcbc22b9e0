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
	run  *runner // nil without Handlers

	jobs      *rdb.Jobs // the enqueue side's scripts and commands
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
		cfg: cfg, rdb: rc, ks: ks,
		aq:   asynq.NewClientFromRedisClient(rc),
		insp: asynq.NewInspectorFromRedisClient(rc),
		jobs: rdb.NewJobs(rc, ks, backlogRecount),
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

// Outcome says what an enqueue did.
type Outcome int

const (
	// Enqueued: a new job was added.
	Enqueued Outcome = iota
	// Duplicate: a job with the same ID is pending, scheduled, running or
	// waiting for a retry in the pool; nothing was added.
	Duplicate
	// Replaced: a finished job with the same ID (completed or archived) was
	// replaced by a new one.
	Replaced
)

func (o Outcome) String() string {
	switch o {
	case Enqueued:
		return "enqueued"
	case Duplicate:
		return "duplicate"
	case Replaced:
		return "replaced"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
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
	Outcome Outcome
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

// EnqueueMany enqueues a batch of jobs, for example a month-end plan.
//
// Every request is checked first: if any is invalid (a job type routed to
// no pool, a tier its pool does not serve), the error matches
// ErrInvalidRequest, lists every problem, and nothing is enqueued.
//
// Jobs with an ID are unique in their pool (see EnqueueOptions.ID): all of
// the batch's IDs are locked and looked up in a few Redis calls, so two
// clients enqueuing the same ID at once add it once. Within one queue, jobs
// are enqueued in the order given, one after the other, so they also start
// in that order; different queues are filled in parallel. On a Redis error
// EnqueueMany stops and returns it; jobs enqueued before it stay queued.
//
// Jobs of pools with a door (max_backlog, enqueue rates) are checked and
// written in one Redis step before the rest of the batch: if the door
// refuses, nothing of the batch is enqueued and the error matches
// ErrRefused (a *BacklogError or a *RateLimitError that says how much room
// there was, or when to retry). See docs/GATEKEEPER.md. On a Redis Cluster
// that step is one per pool: a refusal takes back what the earlier pools
// admitted, except a job a worker started in between (the error says so;
// docs/CLUSTER.md, "On a Redis Cluster").
func (c *Client) EnqueueMany(ctx context.Context, reqs []Request) ([]EnqueueResult, error) {
	results := make([]EnqueueResult, len(reqs))
	pools := make([]*Pool, len(reqs))
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
		pools[i] = p
		results[i] = EnqueueResult{ID: r.Options.ID, Queue: queue, Tier: tier, Outcome: Enqueued}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%w: %s; nothing was enqueued", ErrInvalidRequest, strings.Join(bad, "; "))
	}

	// Unique IDs: lock them, find the ones that exist, replace the
	// finished ones. A repeated ID in the batch is a duplicate of its first.
	type poolID struct {
		pool *Pool
		id   string
	}
	first := map[poolID]int{}
	var unique []int
	for i, r := range reqs {
		if r.Options.ID == "" {
			continue
		}
		key := poolID{pools[i], r.Options.ID}
		if j, ok := first[key]; ok {
			results[i].Outcome = Duplicate
			results[i].Queue, results[i].Tier = results[j].Queue, results[j].Tier
			continue
		}
		first[key] = i
		unique = append(unique, i)
	}
	lockHeld := func() error { return nil }
	replaces := map[int]*rdb.FinishedJob{}
	if len(unique) > 0 {
		found, unlock, lockedAt, err := c.lockAndFind(ctx, reqs, pools, unique)
		if err != nil {
			return nil, err
		}
		defer unlock()
		// The locks expire after enqueueLockTTL: past that, another client
		// could pass the same check. Stop well before.
		lockHeld = func() error {
			if time.Since(lockedAt) > enqueueLockTTL-enqueueLockMargin {
				return fmt.Errorf("enqueue: the batch took longer than its locks last (%s); the jobs enqueued so far stay, enqueue the rest again", enqueueLockTTL-enqueueLockMargin)
			}
			return nil
		}
		for k, i := range unique {
			f := found[k]
			switch {
			case f.Queue == "":
			case f.State == "completed" || f.State == "archived":
				replaces[i] = &rdb.FinishedJob{Queue: f.Queue, State: f.State}
				results[i].Outcome = Replaced
			default:
				results[i].Outcome = Duplicate
				results[i].Queue, results[i].Tier = f.Queue, pools[i].TierOf(f.Queue)
			}
		}
	}

	// Jobs of pools with a door are checked and written in one step, all or
	// nothing, before anything else of the batch is written.
	var door []doorJob
	for i := range reqs {
		if results[i].Outcome != Duplicate && pools[i].cfg.HasDoor() {
			door = append(door, doorJob{i: i, replaces: replaces[i]})
		}
	}
	if len(door) > 0 {
		if err := c.admit(ctx, &doorRequest{reqs: reqs, pools: pools, results: results, jobs: door}); err != nil {
			return nil, err
		}
	}
	for i, f := range replaces {
		if pools[i].cfg.HasDoor() {
			continue // replaced by admit
		}
		if err := c.insp.DeleteTask(f.Queue, reqs[i].Options.ID); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
			return nil, fmt.Errorf("replace finished job %q: %w", reqs[i].Options.ID, err)
		}
	}
	for i, f := range replaces {
		if results[i].Outcome == Replaced {
			// The new job starts with no failures counted.
			id := reqs[i].Options.ID
			_ = clearFailureCounts(ctx, c.rdb, c.ks, pools[i].Name(), id+"@"+f.Queue, id+"@"+results[i].Queue)
		}
	}

	// Streams of jobs enqueued one after the other: one per queue, except
	// that a strict pool's tiers form one stream, highest tier first, so
	// that no worker starts a lower tier's job of the batch while a higher
	// tier's is still to come. Streams run in parallel.
	streamOf := map[string]int{}
	var streams [][]int
	for i := range reqs {
		if results[i].Outcome == Duplicate || pools[i].cfg.HasDoor() {
			continue
		}
		key := results[i].Queue
		if pools[i].tiers != nil && pools[i].cfg.QueueOrder == QueueOrderStrict {
			key = "pool:" + pools[i].Name()
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
		sort.SliceStable(st, func(a, b int) bool {
			return pools[st[a]].rank(results[st[a]].Queue) < pools[st[b]].rank(results[st[b]].Queue)
		})
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(enqueueParallel)
	for _, st := range streams {
		g.Go(func() error {
			for _, i := range st {
				if err := lockHeld(); err != nil {
					return err
				}
				q := results[i].Queue
				task := asynq.NewTaskWithHeaders(reqs[i].JobType, reqs[i].Payload, jobHeaders(time.Now(), reqs[i].Options))
				info, err := c.aq.EnqueueContext(gctx, task, c.options(pools[i], q, reqs[i].Options)...)
				switch {
				case errors.Is(err, asynq.ErrTaskIDConflict):
					// Enqueued meanwhile by something that does not take
					// the lock (asynq's own tools, say); where it is, is
					// not known here: Queue and Tier say where it was asked
					// for.
					results[i].Outcome = Duplicate
				case err != nil:
					return fmt.Errorf("enqueue %s: %w", reqs[i].JobType, err)
				default:
					results[i].ID = info.ID
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return results, nil
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

// lockAndFind takes the enqueue lock of each job reqs[idx[k]], waiting up
// to enqueueLockTTL for locks another client holds, and reports where each
// already exists in its pool. The returned func releases the locks.
func (c *Client) lockAndFind(ctx context.Context, reqs []Request, pools []*Pool, idx []int) ([]rdb.Lookup, func(), time.Time, error) {
	token := newLockToken()
	lockedAt := time.Now()
	var held []rdb.LockJob
	unlock := func() {
		bg := context.WithoutCancel(ctx)
		for _, g := range slotGroups(c.ks, held, func(l rdb.LockJob) string { return l.Pool }) {
			_, _ = c.jobs.Unlock(bg, token, g)
		}
	}
	jobs := make([]rdb.LockJob, len(idx))
	for k, i := range idx {
		jobs[k] = rdb.LockJob{Pool: pools[i].Name(), ID: reqs[i].Options.ID, Queues: pools[i].queues, Breaker: pools[i].cfg.Breaker != nil}
	}
	found := make([]rdb.Lookup, len(idx))
	waiting := make([]int, len(idx)) // positions in idx
	for k := range idx {
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
			res, err := c.jobs.LockAndFind(ctx, token, enqueueLockTTL, part)
			if err != nil {
				// The script may have taken some of these locks: release
				// them all (only ours are deleted).
				held = append(held, part...)
				unlock()
				return nil, nil, time.Time{}, err
			}
			for n, k := range group {
				if res[n].Locked {
					still = append(still, k)
					continue
				}
				held = append(held, jobs[k])
				found[k] = res[n]
			}
		}
		if len(still) == 0 {
			return found, unlock, lockedAt, nil
		}
		if time.Now().After(deadline) {
			unlock()
			return nil, nil, time.Time{}, fmt.Errorf("enqueue lock for job %q: still held after %s by another client", jobs[still[0]].ID, enqueueLockTTL)
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			unlock()
			return nil, nil, time.Time{}, ctx.Err()
		case <-t.C:
		}
		waiting = still
	}
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
