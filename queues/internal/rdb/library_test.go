package rdb

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
)

// A loaded library's locals outlive a call: every one that is not a
// constant or a function must be set again by begin, or one call's state
// would reach the next (a count of leases, "already looked at lapsed
// waiters this millisecond"). A new local that begin forgets fails here.
func TestGateLibBeginResetsState(t *testing.T) {
	top := regexp.MustCompile(`(?m)^local\s+([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*(?:=|--|$)`)
	comma := regexp.MustCompile(`\s*,\s*`)
	constant := regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
	_, after, ok := strings.Cut(gateLib, "local function begin(keys, args)\n")
	require.True(t, ok, "gate_lib.lua has begin")
	body, _, ok := strings.Cut(after, "\nend")
	require.True(t, ok)
	set := map[string]bool{}
	for _, line := range strings.Split(body, "\n") {
		left, _, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		for _, name := range strings.Split(left, ",") {
			set[strings.TrimSpace(name)] = true
		}
	}
	var state []string
	for _, m := range top.FindAllStringSubmatch(gateLib, -1) {
		for _, name := range comma.Split(m[1], -1) {
			if name == "KEYS" || name == "ARGV" || !constant.MatchString(name) {
				state = append(state, name)
			}
		}
	}
	require.Greater(t, len(state), 20, "the parse found the library's state: %v", state)
	for _, name := range state {
		require.True(t, set[name], "begin does not set %q, a local of gate_lib.lua that a call may change", name)
	}
}

// asksOnce runs the same two steps on a pool of one slot: the first job
// takes it, the second waits. It returns the caller's gate.
func asksOnce(t *testing.T, rc redis.UniversalClient) *SlotGate {
	t.Helper()
	b := backend{RC: rc, KS: NewKeyspace(freshNamespace(), false)}
	g := testGate(b, "p1", 1, nil)
	r := step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}})
	require.Equal(t, 1, r.Count)
	require.True(t, r.Asks[0].Taken)
	r = step(t, g, StepArgs{Asks: []Ask{ask(b, "b", "high", 1)}})
	require.Equal(t, 1, r.Count)
	require.False(t, r.Asks[0].Taken, "a pool of one slot, held: the second job waits")
	ws, _ := waiters(t, b, g)
	require.Equal(t, []string{member(b, "b", "high")}, ws)
	return g
}

func libraries(t *testing.T, rc *redis.Client) []string {
	t.Helper()
	libs, err := rc.FunctionList(context.Background(), redis.FunctionListQuery{}).Result()
	require.NoError(t, err)
	var names []string
	for _, l := range libs {
		names = append(names, l.Name)
	}
	return names
}

// On a Redis with functions the gate's library is loaded once and called;
// when it is gone (a restart without persistence, FUNCTION FLUSH) the next
// call loads it again and answers as before.
func TestGateRunsAsFunctions(t *testing.T) {
	rc := redis.NewClient(&redis.Options{Addr: testredis.StartServer(t)})
	defer rc.Close()
	g := asksOnce(t, rc)
	require.False(t, g.lua.scripts(), "the gate ran as functions")
	require.Equal(t, []string{gateLibrary.name}, libraries(t, rc))

	require.NoError(t, rc.FunctionFlush(context.Background()).Err())
	g = asksOnce(t, rc)
	require.False(t, g.lua.scripts(), "loaded again, still functions")
	require.Equal(t, []string{gateLibrary.name}, libraries(t, rc))
}

// Where Redis has no functions (before Redis 7, the embedded Redis) the
// gate runs the same code as scripts.
func TestGateRunsAsScriptsWithoutFunctions(t *testing.T) {
	m := miniredis.RunT(t)
	rc := redis.NewClient(&redis.Options{Addr: m.Addr(), DB: 1})
	defer rc.Close()
	g := asksOnce(t, rc)
	require.True(t, g.lua.scripts(), "no FCALL here: scripts")
}

// aclServer starts a Redis of the test's own (ACL users are server-wide)
// and returns its address and a client of its default user.
func aclServer(t *testing.T) (string, *redis.Client) {
	addr := testredis.StartServer(t)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = admin.Close() })
	return addr, admin
}

// setUser creates or changes ACL user name (password "pw", every key and
// channel, every command) with rules on top.
func setUser(t *testing.T, admin *redis.Client, name string, rules ...string) {
	args := []any{"ACL", "SETUSER", name, "on", ">pw", "~*", "&*", "+@all"}
	for _, r := range rules {
		args = append(args, r)
	}
	require.NoError(t, admin.Do(context.Background(), args...).Err())
}

// An ACL user who may not load functions, or may not call them, gets the
// gate as scripts, and no library is left behind.
func TestGateRunsAsScriptsForAnACLUserWithoutFunctions(t *testing.T) {
	addr, admin := aclServer(t)
	setUser(t, admin, "noload", "-function")
	setUser(t, admin, "nofcall", "-function", "-fcall", "-fcall_ro")
	for _, user := range []string{"noload", "nofcall"} {
		t.Run(user, func(t *testing.T) {
			rc := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: "pw"})
			defer rc.Close()
			g := asksOnce(t, rc)
			require.True(t, g.lua.scripts(), "scripts")
			require.Empty(t, libraries(t, admin))
		})
	}
}

// Once the ACL lets the user load and call functions, a gate that fell
// back to scripts takes the functions up again after scriptsFor.
func TestGateTakesUpFunctionsAgainAfterARefusal(t *testing.T) {
	addr, admin := aclServer(t)
	setUser(t, admin, "app", "-function")
	rc := redis.NewClient(&redis.Options{Addr: addr, Username: "app", Password: "pw"})
	defer rc.Close()
	b := backend{RC: rc, KS: NewKeyspace(freshNamespace(), false)}
	g := testGate(b, "p1", 1, nil)
	r := step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}})
	require.True(t, r.Asks[0].Taken)
	require.True(t, g.lua.scripts(), "refused FUNCTION LOAD: scripts for now")

	setUser(t, admin, "app", "+function")
	g.lua.scriptsUntil.Store(time.Now().Add(-time.Millisecond).UnixNano()) // scriptsFor has passed
	r = step(t, g, StepArgs{Asks: []Ask{ask(b, "b", "high", 1)}})
	require.False(t, r.Asks[0].Taken, "the one slot is a's")
	require.False(t, g.lua.scripts(), "functions again")
	require.Equal(t, []string{gateLibrary.name}, libraries(t, admin))
}

// A Redis at its memory limit (noeviction, as asynq wants) refuses writes
// that need memory, but a release still frees a slot, as it did when the
// gate ran as scripts: otherwise the slots of jobs that ended would stay
// held until their leases lapse.
func TestGateReleasesAtTheMemoryLimit(t *testing.T) {
	for _, mode := range []string{"functions", "scripts"} {
		t.Run(mode, func(t *testing.T) {
			luaFunctionsOff.Store(mode == "scripts")
			defer luaFunctionsOff.Store(false)
			rc := redis.NewClient(&redis.Options{Addr: testredis.StartServer(t, "--maxmemory-policy", "noeviction")})
			defer rc.Close()
			ctx := context.Background()
			b := backend{RC: rc, KS: NewKeyspace(freshNamespace(), false)}
			g := testGate(b, "p1", 2, nil)
			r := step(t, g, StepArgs{Asks: []Ask{ask(b, "a", "high", 1)}})
			require.True(t, r.Asks[0].Taken)
			require.NoError(t, rc.ConfigSet(ctx, "maxmemory", "1").Err())
			defer rc.ConfigSet(ctx, "maxmemory", "0")
			require.ErrorContains(t, rc.Set(ctx, b.KS.Queue("p", "x"), "1", 0).Err(), "OOM", "the server is at its limit")
			_, err := g.Release(ctx, member(b, "a", "high"))
			require.NoError(t, err)
			require.Empty(t, leases(t, b, g), "the slot is free")
			require.Equal(t, mode == "scripts", g.lua.scripts())
		})
	}
}

// The script form on a real Redis: the gate's cases as Redis 6 runs them
// (TestScripts runs them as functions there, and the embedded Redis runs
// only scripts).
func TestScriptsWithoutFunctions(t *testing.T) {
	r := testredis.New(t)
	if r.Mini != nil {
		t.Skip("the embedded Redis runs only scripts: TestScripts covers them")
	}
	luaFunctionsOff.Store(true)
	defer luaFunctionsOff.Store(false)
	for _, c := range scriptCases {
		t.Run(c.script+"/"+c.name, func(t *testing.T) {
			c.run(t, backend{RC: r.Client, KS: NewKeyspace(r.Namespace(t), false), Redis: r})
		})
	}
}
