package rdb

import (
	"strings"

	"github.com/redis/go-redis/v9"
)

// The Redis keys the engine reads and writes. asynq's own key layout is
// private to asynq (unchanged from v0.24 to v0.26); the gate's scripts and
// the unique-ID check read it directly, so it is built here and nowhere
// else, and TestAsynqKeyLayout pins it: an asynq upgrade that moves a key
// fails that test, not production.
//
// Two layouts. On a single Redis (or Sentinel) the names are the ones the
// engine always used. On a Redis Cluster every key of one pool must hash
// to one slot, so that each script touching a pool's tier queues and its
// own state runs on one node: Redis Cluster hashes only the text between
// the first '{' and the next '}' of a key. asynq tags each queue's keys
// with {<queue>}, so a tiered pool's queues are named <ns>:<pool>}:<tier>
// (asynq's key asynq:{<ns>:<pool>}:<tier>}:pending hashes <ns>:<pool>),
// an untiered pool's queue stays <ns>:<pool>, and our own per-pool keys
// carry {<ns>:<pool>} in place of the pool's name. Names and namespaces
// cannot hold braces (namePattern), so the tag is always the pool's.

// Keyspace builds the engine's queue names and keys for one Redis
// topology. The zero cluster value is the single-node layout.
//
// The key builders that are exported serve rdb itself and, to observe or
// disturb the state in Redis, the tests of package queues and the package
// queues/queuestest; the engine's own code calls none of them
// (TestOnlyRdbKnowsTheRedisLayout in package queues keeps it so).
type Keyspace struct {
	ns      string
	cluster bool
}

// NewKeyspace returns the layout of namespace on a single Redis (or
// Sentinel), or with cluster on a Redis Cluster.
func NewKeyspace(namespace string, cluster bool) Keyspace {
	return Keyspace{ns: namespace, cluster: cluster}
}

// Namespace returns the namespace every key of the layout is under.
func (k Keyspace) Namespace() string { return k.ns }

// Cluster says whether this is the Redis Cluster layout.
func (k Keyspace) Cluster() bool { return k.cluster }

// KeyspaceFor returns the layout for rdb: the cluster layout when rdb is a
// *redis.ClusterClient (what redis.NewClusterClient returns, and what
// redis.NewUniversalClient returns for more than one address), the
// single-node layout otherwise.
func KeyspaceFor(namespace string, rdb redis.UniversalClient) Keyspace {
	_, cluster := rdb.(*redis.ClusterClient)
	return Keyspace{ns: namespace, cluster: cluster}
}

// Queue returns the asynq queue of a pool's tier ("" for a pool without
// tiers).
func (k Keyspace) Queue(pool, tier string) string {
	if tier == "" {
		return k.ns + ":" + pool
	}
	if k.cluster {
		return k.ns + ":" + pool + "}:" + tier
	}
	return k.ns + ":" + pool + ":" + tier
}

// pool is how a pool is named inside our keys: its name, or on a cluster
// the hash tag {<ns>:<pool>} its queues' asynq keys share.
func (k Keyspace) pool(pool string) string {
	if k.cluster {
		return "{" + k.ns + ":" + pool + "}"
	}
	return pool
}

// queueTag is the hash tag a queue's keys share on a cluster: the text of
// the queue's name before its first '}' (the pool's <ns>:<pool>). Keys of
// ours that name a queue rather than a pool carry it.
func queueTag(queue string) string {
	if i := strings.IndexByte(queue, '}'); i >= 0 {
		return queue[:i]
	}
	return queue
}

// asynq's per-queue keys. Every key of one queue shares the hash tag
// {queue}.
func QueueKey(queue, suffix string) string { return "asynq:{" + queue + "}:" + suffix }

func PausedKey(queue string) string  { return QueueKey(queue, "paused") }
func PendingKey(queue string) string { return QueueKey(queue, "pending") }
func ActiveKey(queue string) string  { return QueueKey(queue, "active") }

func scheduledKey(queue string) string { return QueueKey(queue, "scheduled") }
func retryKey(queue string) string     { return QueueKey(queue, "retry") }
func archivedKey(queue string) string  { return QueueKey(queue, "archived") }
func completedKey(queue string) string { return QueueKey(queue, "completed") }

// processedKey counts the queue's jobs asynq processed (succeeded or
// failed), since the queue was first used.
func processedKey(queue string) string { return QueueKey(queue, "processed") }

// AllQueuesKey is asynq's set of every queue name (its tools list
// queues from it). On a cluster it has a slot of its own: no script of
// ours touches it, it is written by a call of its own.
const AllQueuesKey = "asynq:queues"

// LeaseKey is the sorted set of a queue's running jobs, scored by the
// Unix second their lease expires.
func LeaseKey(queue string) string { return QueueKey(queue, "lease") }

// TaskKey is the hash of one job; its "state" field says pending,
// active, scheduled, retry, archived or completed.
func TaskKey(queue, id string) string { return QueueKey(queue, "t:"+id) }

// Our own keys, all under the namespace.

// GateKeys returns the Redis keys of a pool's cluster-wide gate: its
// leases and its waiters.
func (k Keyspace) GateKeys(pool string) (leases, waiting string) {
	prefix := k.ns + ":gate:" + k.pool(pool)
	return prefix + ":leases", prefix + ":waiting"
}

// Gate is every key of a pool's cluster-wide gate (docs/CLUSTER.md has
// the table).
type Gate struct {
	// Leases: the slots held, member <job id>@<queue> scored by expiry
	// (Redis's clock, ms); Holders: member -> process holding it; Grace:
	// set for a while after an outage, when nothing new is admitted.
	Leases, Holders, Grace string
	// Waiting: the jobs taken ahead of a slot, by tier then arrival;
	// WaitExpiry: when each lapses; WaitProcs: waiter -> its process.
	Waiting, WaitExpiry, WaitProcs string
	// Places: the place in the waiting line kept for each job taken back
	// from a worker that stopped answering (lua/recover_job.lua), until
	// it asks again.
	Places string
	// PlacesMark is set, with the same expiry, whenever a place is kept:
	// the gate's scripts read it with the size in one MGET and look at
	// Places only while it is there (nearly never).
	PlacesMark string
	// HandBacks: the jobs whose worker a process gave back for a job taken
	// back, each counted until a moment after (lua/gate_lib.lua, handBack).
	HandBacks string
	// Freed is the pub/sub channel of "ask again"; the slots handed to a
	// process's waiters go on its own channel (GrantsChannel).
	Freed string
	// StartRate, Size, Aged: the start rate's state, an operator's size,
	// the starvation guard's marks.
	StartRate, Size, Aged string
	// Procs and ProcsSeen: each process's capacity, and when it lapses.
	Procs, ProcsSeen string
}

// Gate returns the keys of pool's cluster-wide gate.
func (k Keyspace) Gate(pool string) Gate {
	leases, waiting := k.GateKeys(pool)
	procs, seen := k.gateProcsKeys(pool)
	return Gate{
		Leases: leases, Holders: leases + ":holders", Grace: leases + ":grace",
		Waiting: waiting, WaitExpiry: waiting + ":expiry", WaitProcs: waiting + ":procs", Places: waiting + ":recovered", PlacesMark: waiting + ":recovered:mark", HandBacks: waiting + ":handbacks",
		Freed:     leases + ":freed",
		StartRate: k.startRateKey(pool), Size: k.PoolSizeKey(pool), Aged: k.gateAgedKey(pool),
		Procs: procs, ProcsSeen: seen,
	}
}

// startRateKey is the state of a pool's start rate.
func (k Keyspace) startRateKey(pool string) string {
	return k.ns + ":gate:" + k.pool(pool) + ":start-rate"
}

// PoolSizeKey holds a cluster-scoped pool's size set by an operator
// (Client.Resize); absent, the configured size holds.
func (k Keyspace) PoolSizeKey(pool string) string {
	return k.ns + ":gate:" + k.pool(pool) + ":size"
}

// gateProcsKeys returns the keys where each worker process running a
// cluster-scoped pool says how many of its jobs it can run at once (hash:
// process -> concurrency) and until when that holds (sorted set: process,
// scored by Redis's clock in ms), renewed every gateRenewEvery; status adds
// up the live ones to say what the workers can run (PoolSlots.Capacity).
func (k Keyspace) gateProcsKeys(pool string) (capacity, seen string) {
	prefix := k.ns + ":gate:" + k.pool(pool) + ":procs"
	return prefix, prefix + ":seen"
}

// gateAgedKey holds the jobs the starvation guard marked aged: sorted set,
// member <job id>@<queue>, scored by the mark's expiry (Redis's clock, ms).
func (k Keyspace) gateAgedKey(pool string) string {
	return k.ns + ":gate:" + k.pool(pool) + ":aged"
}

// FailureCountKey counts a job's real failures (crashes aside). A job's
// Queue is part of the key: the same ID may be used in two pools. On a
// cluster the key carries its queue's tag, the pool's slot.
func (k Keyspace) FailureCountKey(queue, jobID string) string {
	if k.cluster {
		return k.ns + ":failures:{" + queueTag(queue) + "}:" + queue + ":" + jobID
	}
	return k.ns + ":failures:" + queue + ":" + jobID
}

// enqueueLockKey is held while a job ID is checked and enqueued in a pool,
// so that two clients cannot both find it absent.
func (k Keyspace) enqueueLockKey(pool, jobID string) string {
	return k.ns + ":enqueue-lock:" + k.pool(pool) + ":" + jobID
}

// doorKeys returns the keys of a pool's door: the requests waiting for
// room in its backlog, their data, and its refusal counts.
func (k Keyspace) doorKeys(pool string) (waiting, waitingData, refused string) {
	prefix := k.ns + ":door:" + k.pool(pool)
	return prefix + ":waiting", prefix + ":waiting-data", prefix + ":refused"
}

// doorStateKey is the hash of a pool's door state: the bound of its
// backlog and its own enqueue rates (see lua/admit.lua).
func (k Keyspace) doorStateKey(pool string) string { return k.ns + ":door:" + k.pool(pool) + ":state" }

// rateKey is the state of a caller key's enqueue rate limit of a pool:
// kind is "key:<caller key>". The pool's other rates live in its door
// state (doorStateKey).
func (k Keyspace) rateKey(pool, kind string) string {
	return k.ns + ":rate:" + k.pool(pool) + ":" + kind
}

// BreakerKeys returns the keys of a pool's circuit breaker: its state, the
// counts of its window, the jobs whose failures are in the window, and the
// probes running.
func (k Keyspace) BreakerKeys(pool string) (state, window, suspects, probes string) {
	prefix := k.ns + ":breaker:" + k.pool(pool)
	return prefix, prefix + ":window", prefix + ":suspects", prefix + ":probes"
}

// breakerCountedKey is a sorted set of the jobs (job@queue) of a breaker's
// pool that have a failure count in Redis, scored by when that count
// expires (ms). While it is empty, the jobs that succeed have no count to
// delete, and a tick deletes none (breaker.report).
func (k Keyspace) breakerCountedKey(pool string) string {
	return k.ns + ":breaker:" + k.pool(pool) + ":counted"
}

// BreakerLateKey holds the jobs a trip gave their failure back to before
// asynq had put them in their retry set: each tick looks for them there
// and brings their retry forward (see lua/breaker_late.lua).
func (k Keyspace) BreakerLateKey(pool string) string {
	return k.ns + ":breaker:" + k.pool(pool) + ":late"
}

// NamespacePatterns are SCAN patterns that together match every key of
// namespace in either layout: asynq's keys of its queues, the engine's own
// keys, and on a Redis Cluster those that start with a pool's hash tag.
func NamespacePatterns(namespace string) []string {
	return []string{"asynq:{" + namespace + "*", namespace + "*", "{" + namespace + "*"}
}

// FencedKey is the sorted set of a queue's jobs that a recovery took from
// a worker process that stopped answering, scored by when (Redis's clock,
// ms); a process that was only stalled reads it to learn that it must not
// finish them (lua/recover_job.lua, lua/fence_read.lua). On a cluster the
// key carries its queue's tag, the pool's slot.
func (k Keyspace) FencedKey(queue string) string {
	if k.cluster {
		return k.ns + ":fenced:{" + queueTag(queue) + "}:" + queue
	}
	return k.ns + ":fenced:" + queue
}
