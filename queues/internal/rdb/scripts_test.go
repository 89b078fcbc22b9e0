package rdb

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/internal/testredis"
)

// Every script has cases of its own, registered by its area's test file
// (scriptCases, in an init function), and each case runs twice: on the
// test's Redis (the embedded one, or TEST_REDIS_URL's real one; CI runs
// both) in TestScripts, and on a Redis Cluster of three masters, where
// every key of a call must hash to one slot, in TestScriptsOnCluster.

// scriptCase is one case of one script's test.
type scriptCase struct {
	// script names the script (its Lua file, without .lua) and name the
	// case.
	script, name string
	// run gets a Redis and a layout of its own (a fresh namespace).
	run func(t *testing.T, b backend)
	// singleOnly: the script never runs on a Redis Cluster (say why in
	// the case's comment).
	singleOnly bool
}

// scriptCases are every script's cases.
var scriptCases []scriptCase

// backend is a Redis a case runs on, and the layout of the case's own
// namespace on it.
type backend struct {
	RC      redis.UniversalClient
	KS      Keyspace
	Cluster bool
	// Mini is the embedded Redis, nil on a real one (some timings are
	// driven by its clock: Mini.FastForward).
	Redis *testredis.Redis
}

func freshNamespace() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return "s" + hex.EncodeToString(b[:])
}

func TestScripts(t *testing.T) {
	r := testredis.New(t)
	for _, c := range scriptCases {
		t.Run(c.script+"/"+c.name, func(t *testing.T) {
			ns := r.Namespace(t)
			c.run(t, backend{RC: r.Client, KS: NewKeyspace(ns, false), Redis: r})
		})
	}
}

func TestScriptsOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a Redis Cluster")
	}
	cl := testredis.StartCluster(t, 3)
	for _, c := range scriptCases {
		t.Run(c.script+"/"+c.name, func(t *testing.T) {
			if c.singleOnly {
				t.Skip("this script does not run on a Redis Cluster")
			}
			c.run(t, backend{RC: cl.Client, KS: NewKeyspace(freshNamespace(), true), Cluster: true, Redis: cl.Redis()})
		})
	}
}
