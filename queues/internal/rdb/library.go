package rdb

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A luaLibrary is Lua code shared by several entry points (gate_lib.lua
// and the step, release and renew that use it). Where Redis has functions
// (Redis 7 and later) the library is loaded once per server with FUNCTION
// LOAD and each call is an FCALL: the library's own setup (its local
// functions and tables, some fifty closures for the gate) runs once, not
// on every call as a script's does, which was about a third of what a gate
// call cost Redis (docs/BENCHMARKS.md, section 12). Where Redis has no
// functions (Redis 6, the embedded Redis) or refuses to load them (an ACL
// user without FUNCTION), each entry runs as a script (EVALSHA) built
// from the same code: the same behaviour, at the old cost.
//
// The library's code declares `local KEYS, ARGV` and a `begin(keys, args)`
// that sets them and resets every other piece of state a call keeps: a
// loaded library's locals outlive the call, and nothing one call learnt
// may reach the next. Each entry's code is a chunk that reads KEYS and
// ARGV and returns the reply, as a script's does.
//
// Names carry a hash of the code, so that processes of two versions (a
// rolling upgrade) each call their own: compartment_<name>_<version> for
// the library and compartment_<name>_<entry>_<version> for its functions
// (FUNCTION LIST shows them). A library is never deleted by the runner:
// an operator may drop those of versions no longer running with FUNCTION
// DELETE; a process that finds its own gone loads it again.
type luaLibrary struct {
	name string // the library's name in Redis
	code string // its FUNCTION LOAD source
}

// luaEntry is one entry point of a library.
type luaEntry struct {
	lib    *luaLibrary
	fn     string        // its function's name in Redis
	script *redis.Script // the same entry as a script
}

// newLuaLibrary builds the library name from lib and the entries' chunks
// (entry name -> code), in the order of names. It panics on a library
// without begin: the code is compiled into the binary.
//
// The functions are registered with allow-oom: a script without flags, as
// the entries ran before, is refused only at its first write that needs
// memory, so a release that frees a slot went through on a Redis at its
// memory limit (asynq wants noeviction); a function without the flag
// would be refused before it runs, and slots would stay held until their
// leases lapse. The gate's writes are small and bounded by the jobs.
func newLuaLibrary(name, lib string, names []string, chunks map[string]string) (*luaLibrary, map[string]*luaEntry) {
	if !strings.Contains(lib, "local function begin(keys, args)") {
		panic("rdb: Lua library " + name + " has no begin(keys, args)")
	}
	// The version is a hash of everything loaded (the wrappers and flags
	// included), written in where the placeholder stands: a library of the
	// same name is the same code.
	const v = "@VERSION@"
	var b strings.Builder
	b.WriteString("#!lua name=compartment_" + name + "_" + v + "\n")
	b.WriteString(lib)
	for _, e := range names {
		fmt.Fprintf(&b, "\ndo\nlocal function main()\n%s\nend\nredis.register_function{function_name = %q, flags = {\"allow-oom\"}, callback = function(keys, args) begin(keys, args) return main() end}\nend\n",
			chunks[e], "compartment_"+name+"_"+e+"_"+v)
	}
	sum := sha1.Sum([]byte(b.String()))
	version := hex.EncodeToString(sum[:])[:12]
	l := &luaLibrary{name: "compartment_" + name + "_" + version, code: strings.ReplaceAll(b.String(), v, version)}
	entries := make(map[string]*luaEntry, len(names))
	for _, e := range names {
		script := "local keys_, args_ = KEYS, ARGV\n" + lib + "\nlocal function main()\n" + chunks[e] + "\nend\nbegin(keys_, args_)\nreturn main()\n"
		entries[e] = &luaEntry{lib: l, fn: "compartment_" + name + "_" + e + "_" + version, script: redis.NewScript(script)}
	}
	return l, entries
}

// luaFunctionsOff makes new callers run scripts from the start, as on a
// Redis without functions (tests of the script form on a real Redis).
var luaFunctionsOff atomic.Bool

// scriptsFor is how long a caller runs scripts after the server refused
// the functions for a reason that may pass (an ACL, a failed load) before
// it tries them again.
const scriptsFor = time.Minute

// luaCaller runs entries on one client. It starts with functions; it runs
// scripts for good once the server says it has no functions, and for
// scriptsFor after any other refusal. Safe for concurrent use.
type luaCaller struct {
	rc redis.UniversalClient
	// scriptsUntil: 0 for functions, else the Unix ns until which the
	// caller runs scripts (math.MaxInt64: always).
	scriptsUntil atomic.Int64
}

func newLuaCaller(rc redis.UniversalClient) *luaCaller {
	c := &luaCaller{rc: rc}
	if luaFunctionsOff.Load() {
		c.scriptsUntil.Store(math.MaxInt64)
	}
	return c
}

// scripts says whether the caller runs scripts now.
func (c *luaCaller) scripts() bool {
	u := c.scriptsUntil.Load()
	return u != 0 && time.Now().UnixNano() < u
}

// run calls e with keys and args. Where the function is missing (a server
// that restarted, was flushed, or a new cluster node) it loads the library
// and calls again; where the server refuses functions it runs the same
// code as a script. Either way the refused or missing call ran nothing,
// so nothing runs twice. An error that is not the server's (no answer) is
// returned as it is.
func (c *luaCaller) run(ctx context.Context, e *luaEntry, keys []string, args ...any) *redis.Cmd {
	if !c.scripts() {
		cmd := c.rc.FCall(ctx, e.fn, keys, args...)
		err := cmd.Err()
		switch {
		case err == nil || !(isNoFunctions(err) || isRefused(err) || isFunctionMissing(err)):
			return cmd
		case isNoFunctions(err):
			c.scriptsUntil.Store(math.MaxInt64)
		case isRefused(err):
			c.scriptsUntil.Store(time.Now().Add(scriptsFor).UnixNano())
		default: // missing
			lerr := e.lib.load(ctx, c.rc, keys)
			switch {
			case lerr == nil:
				return c.rc.FCall(ctx, e.fn, keys, args...)
			case isNoFunctions(lerr):
				c.scriptsUntil.Store(math.MaxInt64)
			case isServerError(lerr):
				// Refused (an ACL without FUNCTION LOAD, a server at its
				// memory limit, a read-only replica, a proxy): scripts
				// for a while, then functions again.
				c.scriptsUntil.Store(time.Now().Add(scriptsFor).UnixNano())
			default:
				cmd.SetErr(fmt.Errorf("loading the Lua library %s: %w", e.lib.name, lerr))
				return cmd
			}
		}
	}
	return e.script.Run(ctx, c.rc, keys, args...)
}

// load loads the library on the server that holds keys (on a Redis
// Cluster, the primary of their slot: the other primaries load it when a
// call of theirs finds it missing). One already there (another process
// loaded it) is fine.
func (l *luaLibrary) load(ctx context.Context, rc redis.UniversalClient, keys []string) error {
	var c redis.Cmdable = rc
	if cc, ok := rc.(*redis.ClusterClient); ok && len(keys) > 0 {
		m, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			return err
		}
		c = m
	}
	err := c.FunctionLoad(ctx, l.code).Err()
	if err != nil && strings.Contains(err.Error(), "already exists") {
		return nil
	}
	return err
}

// isServerError: the server answered with an error (not a lost
// connection or a timeout).
func isServerError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// isNoFunctions: the server has no functions (before Redis 7, or the
// embedded Redis, or a proxy that does not pass them on).
func isNoFunctions(err error) bool {
	return isServerError(err) && strings.Contains(strings.ToLower(err.Error()), "unknown command")
}

// isRefused: the server will not let this user call the function (an ACL:
// no FCALL, or no access to a key). Scripts may still be allowed; a
// script refused for a key fails the same way.
func isRefused(err error) bool {
	return isServerError(err) && strings.HasPrefix(err.Error(), "NOPERM")
}

// isFunctionMissing: the server runs functions but not this one.
func isFunctionMissing(err error) bool {
	return isServerError(err) && strings.Contains(err.Error(), "Function not found")
}
