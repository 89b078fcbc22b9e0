package rdb

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

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
func newLuaLibrary(name, lib string, names []string, chunks map[string]string) (*luaLibrary, map[string]*luaEntry) {
	if !strings.Contains(lib, "local function begin(keys, args)") {
		panic("rdb: Lua library " + name + " has no begin(keys, args)")
	}
	h := sha1.New()
	h.Write([]byte(lib))
	for _, e := range names {
		h.Write([]byte{0})
		h.Write([]byte(e))
		h.Write([]byte{0})
		h.Write([]byte(chunks[e]))
	}
	version := hex.EncodeToString(h.Sum(nil))[:12]
	l := &luaLibrary{name: "compartment_" + name + "_" + version}
	entries := make(map[string]*luaEntry, len(names))
	var b strings.Builder
	b.WriteString("#!lua name=" + l.name + "\n")
	b.WriteString(lib)
	for _, e := range names {
		fn := "compartment_" + name + "_" + e + "_" + version
		body := chunks[e]
		fmt.Fprintf(&b, "\ndo\nlocal function main()\n%s\nend\nredis.register_function(%q, function(keys, args) begin(keys, args) return main() end)\nend\n", body, fn)
		script := "local keys_, args_ = KEYS, ARGV\n" + lib + "\nlocal function main()\n" + body + "\nend\nbegin(keys_, args_)\nreturn main()\n"
		entries[e] = &luaEntry{lib: l, fn: fn, script: redis.NewScript(script)}
	}
	l.code = b.String()
	return l, entries
}

// luaFunctionsOff makes new callers run scripts from the start, as on a
// Redis without functions (tests of the script form on a real Redis).
var luaFunctionsOff atomic.Bool

// luaCaller runs entries on one client. It starts with functions and
// keeps to scripts once the server has said it runs none or refuses to
// load them. Safe for concurrent use.
type luaCaller struct {
	rc      redis.UniversalClient
	scripts atomic.Bool
}

func newLuaCaller(rc redis.UniversalClient) *luaCaller {
	c := &luaCaller{rc: rc}
	c.scripts.Store(luaFunctionsOff.Load())
	return c
}

// run calls e with keys and args. Where the function is missing (a server
// that restarted, was flushed, or a new cluster node) it loads the library
// and calls again: a missing function ran nothing, so nothing runs twice.
func (c *luaCaller) run(ctx context.Context, e *luaEntry, keys []string, args ...any) *redis.Cmd {
	if !c.scripts.Load() {
		cmd := c.rc.FCall(ctx, e.fn, keys, args...)
		err := cmd.Err()
		switch {
		case err == nil || !(isNoFunctions(err) || isFunctionMissing(err)):
			return cmd
		case isFunctionMissing(err):
			lerr := e.lib.load(ctx, c.rc)
			if lerr == nil {
				return c.rc.FCall(ctx, e.fn, keys, args...)
			}
			if !isNoFunctions(lerr) {
				cmd.SetErr(fmt.Errorf("loading the Lua library %s: %w", e.lib.name, lerr))
				return cmd
			}
		}
		// The server runs no functions, or will not let this user load
		// them: the same code, as scripts, from now on.
		c.scripts.Store(true)
	}
	return e.script.Run(ctx, c.rc, keys, args...)
}

// load loads the library on every primary that may hold the caller's keys
// (each primary of a Redis Cluster). One already there (another process
// loaded it) is fine.
func (l *luaLibrary) load(ctx context.Context, rc redis.UniversalClient) error {
	if cc, ok := rc.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return l.loadOn(ctx, c) })
	}
	return l.loadOn(ctx, rc)
}

func (l *luaLibrary) loadOn(ctx context.Context, c redis.Cmdable) error {
	err := c.FunctionLoad(ctx, l.code).Err()
	if err != nil && strings.Contains(err.Error(), "already exists") {
		return nil
	}
	return err
}

// isNoFunctions: the server has no functions (before Redis 7, or the
// embedded Redis) or the user may not use them (ACL).
func isNoFunctions(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	s := err.Error()
	return strings.Contains(s, "unknown command") || strings.HasPrefix(s, "NOPERM")
}

// isFunctionMissing: the server runs functions but not this one.
func isFunctionMissing(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.Contains(err.Error(), "Function not found")
}
