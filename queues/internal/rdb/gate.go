package rdb

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The cluster-wide gate's scripts. gate_lib.lua holds what step, release
// and renew share: the three are one Lua library (library.go), loaded
// once per server as functions where Redis has them. Each file's head says
// what it takes and returns.
var (
	//go:embed lua/gate_lib.lua
	gateLib string
	//go:embed lua/gate_step.lua
	gateStepLua string
	//go:embed lua/gate_release.lua
	gateReleaseLua string
	//go:embed lua/gate_renew.lua
	gateRenewLua string
	//go:embed lua/gate_clear.lua
	gateClearLua string
	//go:embed lua/gate_announce.lua
	gateAnnounceLua string

	gateLibrary, gateEntries = newLuaLibrary("gate", gateLib, []string{"step", "release", "renew"},
		map[string]string{"step": gateStepLua, "release": gateReleaseLua, "renew": gateRenewLua})
	gateStep, gateRelease, gateRenew = gateEntries["step"], gateEntries["release"], gateEntries["renew"]

	gateClearScript    = redis.NewScript(gateClearLua)
	gateAnnounceScript = redis.NewScript(gateAnnounceLua)
)

// SlotGateConfig is what a pool's gate scripts are given from the pool's
// configuration and the calling process.
type SlotGateConfig struct {
	// Pool is the pool's name; Queues its queues, highest tier first.
	Pool   string
	Queues []string
	// Size is the pool's configured size. A size an operator set in Redis
	// (Pools.SetSize) wins over it, in the scripts, at every call.
	Size int
	// Strict says the pool's tiers are served in strict order: waiters
	// are ranked by tier, and the lower tiers' queues are paused while a
	// higher one has pending jobs.
	Strict bool
	// StartInterval and StartBurst are the pool's start rate: one start
	// per StartInterval on average, up to StartBurst at once. A zero
	// StartBurst means no start rate.
	StartInterval time.Duration
	StartBurst    int
	// Steering is, per queue (highest tier first), the slots reserved for
	// its tier and the tiers above it and the tier's maximum wait; nil
	// when the pool has neither (the scripts then skip the steering).
	Steering []TierSteering
	// Process names the calling process in the holders of leases and of
	// waiters' places.
	Process string
	// LeaseTTL is how long a lease, or a waiter's place, lasts unless it
	// is renewed (or the waiter asks again).
	LeaseTTL time.Duration
	// Capacity is how many of the pool's jobs the process runs at once
	// (Announce).
	Capacity int
}

// TierSteering is one tier's steering: the slots reserved for it and the
// tiers above it, and its maximum wait (zero: none of either).
type TierSteering struct {
	Reserved int
	MaxWait  time.Duration
}

// SlotGate is one pool's cluster-wide gate in Redis, for one
// configuration of the pool and one process: its scripts' calls, with the
// keys and the fixed arguments encoded once, when it is built. It is
// immutable and safe for concurrent use; a reconfigured pool gets a new
// one, for the same keys.
type SlotGate struct {
	rc      redis.UniversalClient
	lua     *luaCaller // step, release and renew
	keys    Gate
	process string
	// scriptKeys are the KEYS of step, release and renew (gate_lib.lua).
	scriptKeys []string
	// stepHead is the step's ARGV up to its frees; releaseArgs the
	// release's ARGV, with its member (index 1) left to each call.
	stepHead    []any
	releaseArgs []any
	// ttlArg is the lease TTL in ms (renew, announce); announceKeys and
	// capacityArg the announce's keys and the process's capacity.
	ttlArg       string
	announceKeys []string
	capacityArg  string
}

// NewSlotGate returns the gate of the pool c names, in the layout ks, for
// the configuration and process c describes.
func NewSlotGate(rc redis.UniversalClient, ks Keyspace, c SlotGateConfig) *SlotGate {
	k := ks.Gate(c.Pool)
	n := len(c.Queues)
	keys := make([]string, 0, 12+4*n)
	keys = append(keys, k.Leases, k.Waiting, k.WaitExpiry, k.Holders, k.Grace)
	for _, f := range []func(string) string{PausedKey, PendingKey, ActiveKey, LeaseKey} {
		for _, q := range c.Queues {
			keys = append(keys, f(q))
		}
	}
	keys = append(keys, k.StartRate, k.Size, k.Aged, k.PlacesMark, k.Places, k.HandBacks, k.WaitProcs) // the waiters' processes last, always
	size, queues, ttl := strconv.Itoa(c.Size), strconv.Itoa(n), strconv.FormatInt(c.LeaseTTL.Milliseconds(), 10)
	strict := "0"
	if c.Strict {
		strict = "1"
	}
	interval, burst := "0", "0"
	if c.StartBurst != 0 {
		interval = strconv.FormatFloat(float64(c.StartInterval)/float64(time.Millisecond), 'f', -1, 64)
		burst = strconv.Itoa(c.StartBurst)
	}
	steering := steeringArg(c.Steering)
	return &SlotGate{
		rc: rc, lua: newLuaCaller(rc), keys: k, process: c.Process, scriptKeys: keys,
		stepHead:     []any{size, queues, c.Process, ttl, strict, k.Freed, interval, burst, steering},
		releaseArgs:  []any{size, "", queues, k.Freed, strict, interval, burst, steering, ttl, c.Process},
		ttlArg:       ttl,
		announceKeys: []string{k.Procs, k.ProcsSeen, k.Size},
		capacityArg:  strconv.Itoa(c.Capacity),
	}
}

// steeringArg encodes steering for the scripts: "reserved:maxWaitMs," per
// tier, highest first, or "" for none (lua/gate_lib.lua, setSteering).
func steeringArg(steering []TierSteering) string {
	var b strings.Builder
	for _, s := range steering {
		b.WriteString(strconv.Itoa(s.Reserved))
		b.WriteByte(':')
		b.WriteString(strconv.FormatInt(s.MaxWait.Milliseconds(), 10))
		b.WriteByte(',')
	}
	return b.String()
}

// Keys returns the pool's gate keys.
func (s *SlotGate) Keys() Gate { return s.keys }

// StepArgs is what one process asks of the gate in one step: the slots it
// frees, then the jobs that ask for one.
type StepArgs struct {
	Frees []Free
	// Asks are asked in this order: the first may take the last free
	// slot.
	Asks []Ask
}

// Free is a slot a job of the calling process frees: its lease or its
// place among the waiters, only where the calling process holds it (a
// copy of the job that another process runs keeps its own).
type Free struct {
	Member string
	// To is the member of a job of the calling process the slot is handed
	// on to, in the same step ("": none): its lease is written whatever
	// the count, since the job runs already.
	To string
	// Ran says that Member held its slot and never waits in line now (a
	// job that ran, or a stand-in granted a slot), and ToNew that To never
	// asked for a slot: the step then skips looking for them among the
	// waiters. Without them it looks, which is always safe.
	Ran, ToNew bool
}

// Ask is a job that asks for a slot.
type Ask struct {
	Member string
	// Rank is its tier's rank, 1 for the highest.
	Rank int
	// ReadyAt is when the job was first ready to run, Unix ms by the
	// enqueuing process's clock (0: unknown), which the starvation guard
	// counts its wait from.
	ReadyAt int64
	// Waited is how long the job has waited in its process already (a job
	// that waited behind a stand-in: gate's gateStandInPatience): a first
	// question takes its place in line as of that long ago, by Redis's
	// clock, so the wait keeps its seniority. A question asked again keeps
	// the place it has.
	Waited time.Duration
}

// StepReply is the gate's answer to a step.
type StepReply struct {
	// Count is the slots held after the step; Size the pool's size in
	// effect.
	Count, Size int
	// OtherRank is the rank of the best live waiter of another process
	// (0: none) and OtherAge how long it has waited; OtherRank is -1 when
	// no slot may be handed on without asking Redis (see lua/gate_lib.lua,
	// bestOther).
	OtherRank int
	OtherAge  time.Duration
	// Asks answers each Ask, in order.
	Asks []AskReply
	// Granted are the waiters of the calling process a freed slot was
	// handed to: their leases are written.
	Granted []string
}

// AskReply answers one Ask.
type AskReply struct {
	// Taken: the job holds a slot now. Otherwise it is a waiter, unless
	// HandedBack.
	Taken bool
	// HandedBack: the job is back in its queue (behind a job taken back
	// from a worker that stopped answering, whose worker it gives), its
	// place in the waiting line kept: its handler must return at once,
	// and asynq must write nothing for it (lua/gate_lib.lua, handBack).
	HandedBack bool
	// Wait is how long until the start rate allows its start (0: now, or
	// no start rate).
	Wait time.Duration
}

// Step runs the step script: it frees a's slots (handing each on where
// asked), hands the free slots to the best waiters in any process, lets
// each job that asks take a slot or become a waiter, settles the pool's
// pause flags and tells other processes what they were handed (their
// freed channel). One round trip. On failure it returns the error, and
// any part of the step may or may not have happened.
func (s *SlotGate) Step(ctx context.Context, a StepArgs) (StepReply, error) {
	args := make([]any, 0, len(s.stepHead)+1+3*len(a.Frees)+4*len(a.Asks))
	args = append(args, s.stepHead...)
	args = append(args, len(a.Frees))
	for _, f := range a.Frees {
		flags := ""
		if f.Ran {
			flags += "r"
		}
		if f.ToNew {
			flags += "n"
		}
		args = append(args, f.Member, f.To, flags)
	}
	for _, ask := range a.Asks {
		args = append(args, ask.Member, ask.Rank, ask.ReadyAt, max(ask.Waited, 0).Milliseconds())
	}
	res, err := s.lua.run(ctx, gateStep, s.scriptKeys, args...).Slice()
	if err != nil {
		return StepReply{}, fmt.Errorf("gate step: %w", err)
	}
	return parseStep(res, len(a.Asks))
}

// parseStep reads a step's reply to asks Asks (lua/gate_step.lua).
func parseStep(res []any, asks int) (StepReply, error) {
	var r StepReply
	var v [5]int64
	if !ints(res, v[:]) || v[1] != int64(asks) || len(res) < 5+2*asks {
		return StepReply{}, badReply("gate step", res)
	}
	r.Count, r.Size, r.OtherRank, r.OtherAge = int(v[0]), int(v[2]), int(v[3]), time.Duration(v[4])*time.Millisecond
	if asks > 0 {
		r.Asks = make([]AskReply, asks)
		for i := range asks {
			if !ints(res[5+2*i:], v[:2]) {
				return StepReply{}, badReply("gate step", res)
			}
			r.Asks[i] = AskReply{Taken: v[0] == 1, HandedBack: v[0] == 2, Wait: time.Duration(v[1]) * time.Millisecond}
		}
	}
	var ok bool
	if r.Granted, ok = strs(res[5+2*asks:]); !ok {
		return StepReply{}, badReply("gate step", res)
	}
	return r, nil
}

// ReleaseReply is the gate's answer to a release.
type ReleaseReply struct {
	// Count is the slots held after the release.
	Count int
	// Granted are the waiters of the calling process a freed slot was
	// handed to: their leases are written.
	Granted []string
}

// Release runs the release script: it frees member's slot, or its place
// among the waiters, where the calling process holds it; with member "",
// the keeper's tick, it drops what processes that died left behind (leases
// and waiters that lapsed) and ranks the waiters by the tier order in
// effect. Either way it hands the free slots to the best waiters in any
// process, settles the pause flags and tells other processes what they
// were handed. One round trip.
func (s *SlotGate) Release(ctx context.Context, member string) (ReleaseReply, error) {
	args := make([]any, len(s.releaseArgs))
	copy(args, s.releaseArgs)
	args[1] = member
	res, err := s.lua.run(ctx, gateRelease, s.scriptKeys, args...).Slice()
	if err != nil {
		return ReleaseReply{}, fmt.Errorf("gate release: %w", err)
	}
	return parseRelease(res)
}

// parseRelease reads a release's reply (lua/gate_release.lua).
func parseRelease(res []any) (ReleaseReply, error) {
	var count [1]int64
	if !ints(res, count[:]) {
		return ReleaseReply{}, badReply("gate release", res)
	}
	granted, ok := strs(res[1:])
	if !ok {
		return ReleaseReply{}, badReply("gate release", res)
	}
	return ReleaseReply{Count: int(count[0]), Granted: granted}, nil
}

// RenewArgs says which leases a renewal extends, and how.
type RenewArgs struct {
	// Members are the jobs of the calling process that hold a slot.
	Members []string
	// Readd also writes the leases that lapsed (after an outage longer
	// than a lease: a job that still runs holds its slot, whatever the
	// count says), held by the calling process. Without it only leases
	// that exist are extended: a renewal must never bring back a slot a
	// release has just freed.
	Readd bool
	// Grace, when positive, admits nothing new for that long (unless a
	// longer grace runs already), so that every process still running
	// jobs re-adds their slots first.
	Grace time.Duration
}

// Renew runs the renew script: it extends a's leases by the lease TTL,
// from Redis's clock now. It returns the slots held after it. One round
// trip.
func (s *SlotGate) Renew(ctx context.Context, a RenewArgs) (int, error) {
	mode := "XX"
	if a.Readd {
		mode = "ADD"
	}
	args := make([]any, 0, 4+len(a.Members))
	args = append(args, s.ttlArg, s.process, a.Grace.Milliseconds(), mode)
	for _, m := range a.Members {
		args = append(args, m)
	}
	n, err := s.lua.run(ctx, gateRenew, s.scriptKeys, args...).Int64()
	if err != nil {
		return 0, fmt.Errorf("gate renew: %w", err)
	}
	return int(n), nil
}

// Announced is what Announce read, in the same step: the pool's size an
// operator set (0: none), and the live processes that run the pool and
// how many of its jobs they can run at once between them.
type Announced struct {
	OperatorSize, Processes, Capacity int
}

// Announce says that the calling process runs the pool, with the
// configuration's Capacity, for the next lease TTL; with running false,
// that it runs it no more. Processes whose word lapsed are dropped. One
// round trip.
func (s *SlotGate) Announce(ctx context.Context, running bool) (Announced, error) {
	ttl := "0"
	if running {
		ttl = s.ttlArg
	}
	res, err := gateAnnounceScript.Run(ctx, s.rc, s.announceKeys, s.process, s.capacityArg, ttl).Slice()
	if err != nil {
		return Announced{}, fmt.Errorf("gate announce: %w", err)
	}
	var v [3]int64
	if len(res) != 3 || !ints(res, v[:]) {
		return Announced{}, badReply("gate announce", res)
	}
	return Announced{OperatorSize: int(v[0]), Processes: int(v[1]), Capacity: int(v[2])}, nil
}

// ServerID returns the run_id of the Redis server that holds the pool's
// gate keys (on a Redis Cluster, the master of their slot), or "" when it
// reports none (the embedded Redis of the tests). It tells a failover (a
// promoted replica, which may have missed the last writes) from an outage
// of the same server. One round trip (two on a cluster whose slot map is
// not loaded yet).
func (s *SlotGate) ServerID(ctx context.Context) (string, error) {
	var info *redis.StringCmd
	if cc, ok := s.rc.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, s.keys.Leases)
		if err != nil {
			return "", fmt.Errorf("gate server: %w", err)
		}
		info = node.Info(ctx, "server")
	} else {
		info = s.rc.Info(ctx, "server")
	}
	text, err := info.Result()
	if err != nil {
		return "", fmt.Errorf("gate server: %w", err)
	}
	for line := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return v, nil
		}
	}
	return "", nil
}

// Freed is a message on a pool's freed channel or the subscribing
// process's own (GrantsChannel), as it concerns that process.
type Freed struct {
	// AskAgain: every waiter should ask again (room is left and jobs
	// still wait, or the message was not understood: asking again is
	// always safe).
	AskAgain bool
	// Granted are the waiters of the subscribing process a release in
	// another process handed a slot to: their leases are written.
	Granted []string
}

// The messages (lua/gate_lib.lua, announce): "1", on the pool's freed
// channel, asks every waiter to ask again; "g" then one
// "process<TAB>member" line per waiter handed a slot, on that process's
// own channel (from a process of an earlier version: on the pool's, with
// other processes' lines, which are skipped).
const (
	freedAskAgain = "1"
	freedGrants   = "g\n"
)

// parseFreed reads a message of the freed channel for process.
func parseFreed(payload, process string) Freed {
	rest, ok := strings.CutPrefix(payload, freedGrants)
	if !ok {
		// "1", or a message this version does not know.
		return Freed{AskAgain: true}
	}
	var f Freed
	for line := range strings.SplitSeq(rest, "\n") {
		if proc, member, ok := strings.Cut(line, "\t"); ok && proc == process {
			f.Granted = append(f.Granted, member)
		}
	}
	return f
}

// FreedSubscription is a subscription to a pool's freed channel: slots a
// release handed to waiters, and "ask again".
type FreedSubscription struct {
	ps      *redis.PubSub
	process string
}

// SubscribeFreed subscribes to the pool's freed channel (the same for
// every configuration of the pool: "ask again") and to the process's own
// (the slots handed to its waiters: GrantsChannel). Close it when done.
func (s *SlotGate) SubscribeFreed(ctx context.Context) *FreedSubscription {
	return &FreedSubscription{ps: s.rc.Subscribe(ctx, s.keys.Freed, GrantsChannel(s.keys.Freed, s.process)), process: s.process}
}

// GrantsChannel is the channel on which the gate tells process of the
// slots a release elsewhere handed to its waiters (lua/gate_lib.lua,
// announce): the pool's freed channel, then ":" and the process.
func GrantsChannel(freed, process string) string { return freed + ":" + process }

// Each calls fn with each message, read for the subscribing process, until
// the subscription is closed. A message with nothing for the process (the
// slots handed to other processes' waiters, published on the pool's
// channel by a process of an earlier version) is skipped.
func (f *FreedSubscription) Each(fn func(Freed)) {
	for msg := range f.ps.Channel() {
		if m := parseFreed(msg.Payload, f.process); m.AskAgain || len(m.Granted) > 0 {
			fn(m)
		}
	}
}

// Close ends the subscription; Each returns.
func (f *FreedSubscription) Close() error { return f.ps.Close() }

// ClearGatePauses lifts the pauses the gate set (GatePause) on queues,
// which must share one hash slot on a Redis Cluster (one pool's). An
// operator's pause, and a circuit breaker's, stay. One round trip.
func ClearGatePauses(ctx context.Context, rc redis.UniversalClient, queues []string) error {
	keys := make([]string, len(queues))
	for i, q := range queues {
		keys[i] = PausedKey(q)
	}
	if err := gateClearScript.Run(ctx, rc, keys).Err(); err != nil {
		return fmt.Errorf("clear the gate's pauses: %w", err)
	}
	return nil
}

// ints reads the first len(out) values of res, which must be integers,
// into out; it says whether they were.
func ints(res []any, out []int64) bool {
	if len(res) < len(out) {
		return false
	}
	for i := range out {
		v, ok := res[i].(int64)
		if !ok {
			return false
		}
		out[i] = v
	}
	return true
}

// strs returns res as strings (nil for none); ok is false when one is not
// a string.
func strs(res []any) ([]string, bool) {
	if len(res) == 0 {
		return nil, true
	}
	out := make([]string, len(res))
	for i, v := range res {
		s, ok := v.(string)
		if !ok {
			return nil, false
		}
		out[i] = s
	}
	return out, true
}

// badReply is the error for a reply of the wrong shape: a script and its
// caller out of step (a Redis that runs an older script under the same
// name cannot: scripts go by their digest).
func badReply(what string, reply any) error {
	return fmt.Errorf("%s: unexpected reply %v", what, reply)
}
