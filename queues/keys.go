package queues

// The Redis keys the engine reads and writes. asynq's own key layout is
// private to asynq (unchanged from v0.24 to v0.26); the gate's scripts and
// the unique-ID check read it directly, so it is built here and nowhere
// else, and TestAsynqKeyLayout pins it: an asynq upgrade that moves a key
// fails that test, not production.

// QueueName returns the asynq queue of a pool's tier; tier "" names the
// queue of a pool without tiers.
func QueueName(namespace, pool, tier string) string {
	if tier == "" {
		return namespace + ":" + pool
	}
	return namespace + ":" + pool + ":" + tier
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

// asynqAllQueues is asynq's set of every queue name (its tools list
// queues from it).
const asynqAllQueues = "asynq:queues"

// asynqLeaseKey is the sorted set of a queue's running jobs, scored by the
// Unix second their lease expires.
func asynqLeaseKey(queue string) string { return asynqQueueKey(queue, "lease") }

// asynqTaskKey is the hash of one job; its "state" field says pending,
// active, scheduled, retry, archived or completed.
func asynqTaskKey(queue, id string) string { return asynqQueueKey(queue, "t:"+id) }

// Our own keys, all under the namespace.

// GateKeys returns the Redis keys of a pool's cluster-wide gate: its leases
// and its waiters.
func GateKeys(namespace, pool string) (leases, waiting string) {
	prefix := namespace + ":gate:" + pool
	return prefix + ":leases", prefix + ":waiting"
}

// startRateKey is the state of a pool's start rate.
func startRateKey(namespace, pool string) string {
	return namespace + ":gate:" + pool + ":start-rate"
}

// poolSizeKey holds a cluster-scoped pool's size set by an operator
// (Client.Resize); absent, the configured size holds.
func poolSizeKey(namespace, pool string) string {
	return namespace + ":gate:" + pool + ":size"
}

// gateAgedKey holds the jobs the starvation guard marked aged: sorted set,
// member <job id>@<queue>, scored by the mark's expiry (Redis's clock, ms).
func gateAgedKey(namespace, pool string) string {
	return namespace + ":gate:" + pool + ":aged"
}

// failureCountKey counts a job's real failures (crashes aside). A job's
// queue is part of the key: the same ID may be used in two pools.
func failureCountKey(namespace, queue, jobID string) string {
	return namespace + ":failures:" + queue + ":" + jobID
}

// enqueueLockKey is held while a job ID is checked and enqueued in a pool,
// so that two clients cannot both find it absent.
func enqueueLockKey(namespace, pool, jobID string) string {
	return namespace + ":enqueue-lock:" + pool + ":" + jobID
}

// doorKeys returns the keys of a pool's door: the requests waiting for
// room in its backlog, their data, and its refusal counts.
func doorKeys(namespace, pool string) (waiting, waitingData, refused string) {
	prefix := namespace + ":door:" + pool
	return prefix + ":waiting", prefix + ":waiting-data", prefix + ":refused"
}

// doorStateKey is the hash of a pool's door state: the bound of its
// backlog and its own enqueue rates (see lua/admit.lua).
func doorStateKey(namespace, pool string) string { return namespace + ":door:" + pool + ":state" }

// rateKey is the state of a caller key's enqueue rate limit of a pool:
// kind is "key:<caller key>". The pool's other rates live in its door
// state (doorStateKey).
func rateKey(namespace, pool, kind string) string {
	return namespace + ":rate:" + pool + ":" + kind
}

// QueueKeysPattern is a SCAN pattern matching every asynq key of every
// queue under namespace, for tools that clean a namespace up.
func QueueKeysPattern(namespace string) string { return "asynq:{" + namespace + "*" }

// breakerKeys returns the keys of a pool's circuit breaker: its state, the
// counts of its window, the jobs whose failures are in the window, and the
// probes running.
func breakerKeys(namespace, pool string) (state, window, suspects, probes string) {
	prefix := namespace + ":breaker:" + pool
	return prefix, prefix + ":window", prefix + ":suspects", prefix + ":probes"
}

// breakerCountedKey is a sorted set of the jobs (job@queue) of a breaker's
// pool that have a failure count in Redis, scored by when that count
// expires (ms). While it is empty, the jobs that succeed have no count to
// delete, and a tick deletes none (breaker.report).
func breakerCountedKey(namespace, pool string) string {
	return namespace + ":breaker:" + pool + ":counted"
}

// breakerLateKey holds the jobs a trip gave their failure back to before
// asynq had put them in their retry set: each tick looks for them there
// and brings their retry forward (see lua/breaker_late.lua).
func breakerLateKey(namespace, pool string) string {
	return namespace + ":breaker:" + pool + ":late"
}
