package queues

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

// keyspace builds the engine's queue names and keys for one Redis
// topology. The zero cluster value is the single-node layout.
type keyspace struct {
	ns      string
	cluster bool
}

// newKeyspace returns the layout for rdb: the cluster layout when rdb is a
// *redis.ClusterClient (what redis.NewClusterClient returns, and what
// redis.NewUniversalClient returns for more than one address), the
// single-node layout otherwise.
func newKeyspace(namespace string, rdb redis.UniversalClient) keyspace {
	_, cluster := rdb.(*redis.ClusterClient)
	return keyspace{ns: namespace, cluster: cluster}
}

// queue returns the asynq queue of a pool's tier ("" for a pool without
// tiers).
func (k keyspace) queue(pool, tier string) string {
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
func (k keyspace) pool(pool string) string {
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

// QueueName returns the asynq queue of a pool's tier on a single Redis or
// Sentinel; tier "" names the queue of a pool without tiers (the same on
// a Redis Cluster). On a cluster a tier's queue is <ns>:<pool>}:<tier>:
// Pool.Queues gives a client's queues on any topology.
func QueueName(namespace, pool, tier string) string {
	return keyspace{ns: namespace}.queue(pool, tier)
}

// asynq's per-queue keys. Every key of one queue shares the hash tag
// {queue}.
func asynqQueueKey(queue, suffix string) string { return "asynq:{" + queue + "}:" + suffix }

func asynqPausedKey(queue string) string  { return asynqQueueKey(queue, "paused") }
func asynqPendingKey(queue string) string { return asynqQueueKey(queue, "pending") }
func asynqActiveKey(queue string) string  { return asynqQueueKey(queue, "active") }

func asynqScheduledKey(queue string) string { return asynqQueueKey(queue, "scheduled") }
func asynqRetryKey(queue string) string     { return asynqQueueKey(queue, "retry") }
func asynqArchivedKey(queue string) string  { return asynqQueueKey(queue, "archived") }
func asynqCompletedKey(queue string) string { return asynqQueueKey(queue, "completed") }

// asynqProcessedKey counts the queue's jobs asynq processed (succeeded or
// failed), since the queue was first used.
func asynqProcessedKey(queue string) string { return asynqQueueKey(queue, "processed") }

// asynqAllQueues is asynq's set of every queue name (its tools list
// queues from it). On a cluster it has a slot of its own: no script of
// ours touches it, it is written by a call of its own.
const asynqAllQueues = "asynq:queues"

// asynqLeaseKey is the sorted set of a queue's running jobs, scored by the
// Unix second their lease expires.
func asynqLeaseKey(queue string) string { return asynqQueueKey(queue, "lease") }

// asynqTaskKey is the hash of one job; its "state" field says pending,
// active, scheduled, retry, archived or completed.
func asynqTaskKey(queue, id string) string { return asynqQueueKey(queue, "t:"+id) }

// Our own keys, all under the namespace.

// GateKeys returns the Redis keys of a pool's cluster-wide gate on a
// single Redis or Sentinel: its leases and its waiters.
func GateKeys(namespace, pool string) (leases, waiting string) {
	return keyspace{ns: namespace}.gateKeys(pool)
}

// gateKeys returns the Redis keys of a pool's cluster-wide gate: its
// leases and its waiters.
func (k keyspace) gateKeys(pool string) (leases, waiting string) {
	prefix := k.ns + ":gate:" + k.pool(pool)
	return prefix + ":leases", prefix + ":waiting"
}

// startRateKey is the state of a pool's start rate.
func (k keyspace) startRateKey(pool string) string {
	return k.ns + ":gate:" + k.pool(pool) + ":start-rate"
}

// poolSizeKey holds a cluster-scoped pool's size set by an operator
// (Client.Resize); absent, the configured size holds.
func (k keyspace) poolSizeKey(pool string) string {
	return k.ns + ":gate:" + k.pool(pool) + ":size"
}

// gateProcsKeys returns the keys where each worker process running a
// cluster-scoped pool says how many of its jobs it can run at once (hash:
// process -> concurrency) and until when that holds (sorted set: process,
// scored by Redis's clock in ms), renewed every gateRenewEvery; status adds
// up the live ones to say what the workers can run (PoolSlots.Capacity).
func (k keyspace) gateProcsKeys(pool string) (capacity, seen string) {
	prefix := k.ns + ":gate:" + k.pool(pool) + ":procs"
	return prefix, prefix + ":seen"
}

// gateAgedKey holds the jobs the starvation guard marked aged: sorted set,
// member <job id>@<queue>, scored by the mark's expiry (Redis's clock, ms).
func (k keyspace) gateAgedKey(pool string) string {
	return k.ns + ":gate:" + k.pool(pool) + ":aged"
}

// failureCountKey counts a job's real failures (crashes aside). A job's
// queue is part of the key: the same ID may be used in two pools. On a
// cluster the key carries its queue's tag, the pool's slot.
func (k keyspace) failureCountKey(queue, jobID string) string {
	if k.cluster {
		return k.ns + ":failures:{" + queueTag(queue) + "}:" + queue + ":" + jobID
	}
	return k.ns + ":failures:" + queue + ":" + jobID
}

// enqueueLockKey is held while a job ID is checked and enqueued in a pool,
// so that two clients cannot both find it absent.
func (k keyspace) enqueueLockKey(pool, jobID string) string {
	return k.ns + ":enqueue-lock:" + k.pool(pool) + ":" + jobID
}

// doorKeys returns the keys of a pool's door: the requests waiting for
// room in its backlog, their data, and its refusal counts.
func (k keyspace) doorKeys(pool string) (waiting, waitingData, refused string) {
	prefix := k.ns + ":door:" + k.pool(pool)
	return prefix + ":waiting", prefix + ":waiting-data", prefix + ":refused"
}

// doorStateKey is the hash of a pool's door state: the bound of its
// backlog and its own enqueue rates (see lua/admit.lua).
func (k keyspace) doorStateKey(pool string) string { return k.ns + ":door:" + k.pool(pool) + ":state" }

// rateKey is the state of a caller key's enqueue rate limit of a pool:
// kind is "key:<caller key>". The pool's other rates live in its door
// state (doorStateKey).
func (k keyspace) rateKey(pool, kind string) string {
	return k.ns + ":rate:" + k.pool(pool) + ":" + kind
}

// QueueKeysPattern is a SCAN pattern matching every asynq key of every
// queue under namespace, for tools that clean a namespace up (either
// layout).
func QueueKeysPattern(namespace string) string { return "asynq:{" + namespace + "*" }

// breakerKeys returns the keys of a pool's circuit breaker: its state, the
// counts of its window, the jobs whose failures are in the window, and the
// probes running.
func (k keyspace) breakerKeys(pool string) (state, window, suspects, probes string) {
	prefix := k.ns + ":breaker:" + k.pool(pool)
	return prefix, prefix + ":window", prefix + ":suspects", prefix + ":probes"
}

// breakerCountedKey is a sorted set of the jobs (job@queue) of a breaker's
// pool that have a failure count in Redis, scored by when that count
// expires (ms). While it is empty, the jobs that succeed have no count to
// delete, and a tick deletes none (breaker.report).
func (k keyspace) breakerCountedKey(pool string) string {
	return k.ns + ":breaker:" + k.pool(pool) + ":counted"
}

// breakerLateKey holds the jobs a trip gave their failure back to before
// asynq had put them in their retry set: each tick looks for them there
// and brings their retry forward (see lua/breaker_late.lua).
func (k keyspace) breakerLateKey(pool string) string {
	return k.ns + ":breaker:" + k.pool(pool) + ":late"
}
