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

var (
	//go:embed lua/adaptive_tick.lua
	adaptiveTickLua string
	//go:embed lua/adaptive_override.lua
	adaptiveOverrideLua string
	//go:embed lua/adaptive_clear.lua
	adaptiveClearLua string

	adaptiveTickScript     = redis.NewScript(adaptiveTickLua)
	adaptiveOverrideScript = redis.NewScript(adaptiveOverrideLua)
	adaptiveClearScript    = redis.NewScript(adaptiveClearLua)
)

// AdaptiveLogKeep is how many changes of a pool's adaptive limit Redis
// keeps, newest first.
const AdaptiveLogKeep = 50

// Adaptive is a pool's adaptive limit in Redis: its state, the windows the
// worker processes report into, and the log of its changes, all in the
// pool's slot with its gate (the limit is written to the size key the
// gate reads).
type Adaptive struct {
	rc   redis.UniversalClient
	keys [5]string // state, windows, size, log, leases
}

// NewAdaptive returns pool's adaptive limit over rc, in the layout ks.
func NewAdaptive(rc redis.UniversalClient, ks Keyspace, pool string) Adaptive {
	g := ks.Gate(pool)
	prefix := ks.ns + ":gate:" + ks.pool(pool) + ":adaptive"
	return Adaptive{rc: rc, keys: [5]string{prefix, prefix + ":windows", g.Size, prefix + ":log", g.Leases}}
}

// AdaptiveParams are a pool's adaptive settings, as the tick needs them.
type AdaptiveParams struct {
	Window               time.Duration
	Min, Max, Configured int
	Tolerance            float64
}

// AdaptiveSample is what one process saw of a pool's jobs since its last
// tick.
type AdaptiveSample struct {
	Jobs       int64
	Work, Wait time.Duration
}

// AdaptiveDecision is a tick's reply.
type AdaptiveDecision struct {
	// Limit is the limit now; From what it was before this tick.
	Limit, From int
	// Changed says this tick changed it, for Reason.
	Changed bool
	Reason  string
	// Baseline and Sample are the job latencies the decision compared
	// (zero when this tick decided nothing).
	Baseline, Sample time.Duration
	// Operator says an operator's size is in effect: the limit is kept
	// but not written to the size.
	Operator bool
}

// Tick reports s and, when due, decides the limit (lua/adaptive_tick.lua).
// One round trip.
func (a Adaptive) Tick(ctx context.Context, p AdaptiveParams, s AdaptiveSample) (AdaptiveDecision, error) {
	ms := func(d time.Duration) string {
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
	}
	res, err := adaptiveTickScript.Run(ctx, a.rc, a.keys[:],
		s.Jobs, ms(s.Work), ms(s.Wait), p.Window.Milliseconds(), p.Min, p.Max, p.Configured,
		strconv.FormatFloat(p.Tolerance, 'f', -1, 64), AdaptiveLogKeep, (10 * p.Window).Milliseconds()).Result()
	if err != nil {
		return AdaptiveDecision{}, fmt.Errorf("adaptive limit: %w", err)
	}
	v, ok := res.([]any)
	if !ok || len(v) != 7 {
		return AdaptiveDecision{}, badReply("adaptive tick", res)
	}
	var nums [3]int64
	var tail [3]int64
	reason, ok2 := v[3].(string)
	if !ints(v[:3], nums[:]) || !ints(v[4:], tail[:]) || !ok2 {
		return AdaptiveDecision{}, badReply("adaptive tick", res)
	}
	return AdaptiveDecision{
		Limit: int(nums[0]), Changed: nums[1] == 1, From: int(nums[2]), Reason: reason,
		Baseline: time.Duration(tail[0]) * time.Microsecond, Sample: time.Duration(tail[1]) * time.Microsecond,
		Operator: tail[2] == 1,
	}, nil
}

// Override sets an operator's size for the pool (size >= 1) and keeps the
// adaptive limit from writing it, or with size 0 takes it away: the
// adaptive limit holds again at once. One round trip.
func (a Adaptive) Override(ctx context.Context, size int) error {
	arg := ""
	if size > 0 {
		arg = strconv.Itoa(size)
	}
	if err := adaptiveOverrideScript.Run(ctx, a.rc, []string{a.keys[0], a.keys[2], a.keys[3]}, arg, AdaptiveLogKeep).Err(); err != nil {
		return fmt.Errorf("adaptive limit: operator's size: %w", err)
	}
	return nil
}

// Clear drops the adaptive limit's state, and the size it wrote unless an
// operator's is in effect: for a pool that is no longer adaptive. One
// round trip.
func (a Adaptive) Clear(ctx context.Context) error {
	if err := adaptiveClearScript.Run(ctx, a.rc, []string{a.keys[0], a.keys[1], a.keys[2]}).Err(); err != nil {
		return fmt.Errorf("adaptive limit: clear: %w", err)
	}
	return nil
}

// AdaptiveState is a pool's adaptive limit as status shows it.
type AdaptiveState struct {
	// Limit is the limit now (0 before the first tick); Operator says an
	// operator's size is in effect instead.
	Limit    int
	Operator bool
	// Reason is why it last changed, At when.
	Reason string
	At     time.Time
	// Baseline is the job latency it compares with (0 before any).
	Baseline time.Duration
	// ChangeCount counts its changes since it was first set.
	ChangeCount int64
	// Changes are its latest changes, newest first.
	Changes []AdaptiveChange
}

// AdaptiveChange is one change of an adaptive limit, or an operator's
// override or reset of it (From or To 0: not a number).
type AdaptiveChange struct {
	At       time.Time
	From, To int
	Reason   string
}

// AdaptiveRead is an adaptive limit's state in a Batch.
type AdaptiveRead struct {
	state *redis.SliceCmd
	log   *redis.StringSliceCmd
}

// Adaptive queues a read of pool's adaptive limit and its last changes
// (up to changes of them).
func (b *Batch) Adaptive(pool string, changes int) *AdaptiveRead {
	a := NewAdaptive(b.p.rc, b.p.ks, pool)
	r := &AdaptiveRead{}
	b.reads = append(b.reads, func(ctx context.Context, pipe redis.Pipeliner) {
		r.state = pipe.HMGet(ctx, a.keys[0], "limit", "operator", "reason", "at", "baseline", "changes")
		r.log = pipe.LRange(ctx, a.keys[3], 0, int64(changes)-1)
	})
	return r
}

// Result returns the state, or the read's error.
func (r *AdaptiveRead) Result() (AdaptiveState, error) {
	vals, err := r.state.Result()
	if err != nil {
		return AdaptiveState{}, err
	}
	entries, err := r.log.Result()
	if err != nil {
		return AdaptiveState{}, err
	}
	if len(vals) != 6 {
		return AdaptiveState{}, badReply("adaptive state", vals)
	}
	str := func(i int) string { s, _ := vals[i].(string); return s }
	var s AdaptiveState
	if f, err := strconv.ParseFloat(str(0), 64); err == nil {
		s.Limit = int(f + 0.5)
	}
	s.Operator = str(1) == "1"
	s.Reason = str(2)
	if ms, err := strconv.ParseInt(str(3), 10, 64); err == nil {
		s.At = time.UnixMilli(ms)
	}
	if f, err := strconv.ParseFloat(str(4), 64); err == nil {
		s.Baseline = time.Duration(f * float64(time.Millisecond))
	}
	s.ChangeCount, _ = strconv.ParseInt(str(5), 10, 64)
	for _, e := range entries {
		parts := strings.SplitN(e, "|", 4)
		if len(parts) != 4 {
			continue
		}
		ms, _ := strconv.ParseInt(parts[0], 10, 64)
		from, _ := strconv.Atoi(parts[1])
		to, _ := strconv.Atoi(parts[2])
		s.Changes = append(s.Changes, AdaptiveChange{At: time.UnixMilli(ms), From: from, To: to, Reason: parts[3]})
	}
	return s, nil
}
