package queues

import (
	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// The Redis keys are built in package rdb (queues/internal/rdb) and nowhere
// else; these are the names a user of the engine may need.

// QueueName returns the asynq queue of a pool's tier on a single Redis or
// Sentinel; tier "" names the queue of a pool without tiers (the same on
// a Redis Cluster). On a cluster a tier's queue is <ns>:<pool>}:<tier>:
// Pool.Queues gives a client's queues on any topology.
func QueueName(namespace, pool, tier string) string {
	return rdb.NewKeyspace(namespace, false).Queue(pool, tier)
}

// NamespaceKeyPatterns are SCAN patterns that together match every key the
// engine and asynq keep for the queues and pools under namespace, on a
// single Redis or a Redis Cluster, for tools that delete a namespace (the
// bench does, between its runs). Other namespaces' keys may match a
// pattern if their names start with namespace.
func NamespaceKeyPatterns(namespace string) []string { return rdb.NamespacePatterns(namespace) }
