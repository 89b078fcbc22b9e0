// Package rdb is the engine's layer over Redis: the only place that knows
// how the engine's state is laid out there. It builds every key (the
// engine's own and asynq's, which the engine's scripts read and write in
// the same atomic steps as asynq would), holds the Lua scripts, and
// encodes asynq's task message for the jobs the door writes itself.
//
// Above it, package queues speaks in pools, tiers, slots and jobs. Nothing
// outside rdb builds a key or assembles a script's arguments; each script
// sits behind one method with typed parameters and a typed reply, and has
// a test of its own against the embedded Redis, a real one (TEST_REDIS_URL)
// and, where it runs there, a Redis Cluster.
//
// asynq's key layout is private to asynq; it has not changed from v0.24
// to v0.26, and TestAsynqKeyLayout fails if an upgrade moves a key.
package rdb
