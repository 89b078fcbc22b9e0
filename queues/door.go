package queues

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/lci-labs/compartment/priority"
)

// The door's settings and errors. The door (the story's gatekeeper) stands at the entrance of
// each pool: before a job is written into its queue, the pool's backlog
// limits and enqueue rates are checked, in Redis, in the same step that
// writes it (see admit.go and docs/DOOR.md).

// Rate is a rate limit: at most Limit events per Per, with bursts of up to
// Burst at once. It is enforced with the generic cell rate algorithm
// (GCRA) in Redis, shared by every process on the same Redis and
// namespace: events are spaced Per/Limit apart on average, and up to Burst
// may come at once after a quiet spell.
type Rate struct {
	// Limit is the number of events per Per. At least 1.
	Limit int `json:"limit"`
	// Per is the interval. At least 1ms.
	Per time.Duration `json:"per"`
	// Burst is how many events may come at once. Defaults to Limit.
	Burst int `json:"burst,omitempty"`
}

func (r Rate) String() string {
	return fmt.Sprintf("%d per %s (burst %d)", r.Limit, r.Per, r.Burst)
}

// interval is the time between two events at the steady rate.
func (r Rate) interval() time.Duration { return r.Per / time.Duration(r.Limit) }

func (r *Rate) withDefaults() *Rate {
	if r == nil {
		return nil
	}
	c := *r
	if c.Burst == 0 {
		c.Burst = c.Limit
	}
	return &c
}

func (r *Rate) problems(label, key string) []string {
	if r == nil {
		return nil
	}
	var out []string
	if r.Limit < 1 {
		out = append(out, fmt.Sprintf("%s: %s: limit must be >= 1, got %d", label, key, r.Limit))
	}
	if r.Per < time.Millisecond {
		out = append(out, fmt.Sprintf("%s: %s: per must be at least 1ms, got %s", label, key, r.Per))
	} else if r.Limit >= 1 && r.interval() < time.Microsecond {
		out = append(out, fmt.Sprintf("%s: %s: %d per %s is faster than one per microsecond", label, key, r.Limit, r.Per))
	}
	if r.Burst < 1 {
		out = append(out, fmt.Sprintf("%s: %s: burst must be >= 1, got %d", label, key, r.Burst))
	}
	return out
}

// MaxBacklogWait bounds PoolConfig.BacklogWait: a waiting batch keeps its
// job IDs locked, and the locks last a minute.
const MaxBacklogWait = 30 * time.Second

// doorProblems checks the door's settings of a pool (defaults filled).
func (p PoolConfig) doorProblems(label string, policy *priority.Policy) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if p.MaxBacklog < 0 {
		add("%s: max_backlog must be >= 0 (0: unbounded), got %d", label, p.MaxBacklog)
	}
	if len(p.TierLimits) > 0 {
		switch {
		case p.Tiers == nil:
			add("%s: tier_limits need tiers", label)
		case p.MaxBacklog <= 0:
			add("%s: tier_limits need max_backlog", label)
		}
		for _, t := range slices.Sorted(maps.Keys(p.TierLimits)) {
			l := p.TierLimits[t]
			if p.Tiers != nil && !slices.Contains(p.Tiers, t) {
				add("%s: tier_limits: tier %q is not one of the pool's tiers (%q)", label, t, p.Tiers)
			}
			if l < 1 {
				add("%s: tier_limits: tier %q must be >= 1, got %d", label, t, l)
			} else if p.MaxBacklog > 0 && l > p.MaxBacklog {
				add("%s: tier_limits: tier %q limit %d is above the pool's max_backlog %d", label, t, l, p.MaxBacklog)
			}
		}
	}
	switch {
	case p.BacklogWait < 0:
		add("%s: backlog_wait must be >= 0, got %s", label, p.BacklogWait)
	case p.BacklogWait > MaxBacklogWait:
		add("%s: backlog_wait must be at most %s, got %s", label, MaxBacklogWait, p.BacklogWait)
	case p.BacklogWait > 0 && p.MaxBacklog <= 0:
		add("%s: backlog_wait needs max_backlog", label)
	}
	out = append(out, p.EnqueueRate.problems(label, "enqueue_rate")...)
	out = append(out, p.EnqueueRatePerKey.problems(label, "enqueue_rate_per_key")...)
	for _, jt := range slices.Sorted(maps.Keys(p.JobTypeRates)) {
		r := p.JobTypeRates[jt]
		if !slices.Contains(p.JobTypes, jt) {
			add("%s: job_type_rates: job type %q is not routed to this pool (its job types: %q)", label, jt, p.JobTypes)
		}
		out = append(out, r.problems(label, fmt.Sprintf("job_type_rates: %q", jt))...)
	}
	out = append(out, p.StartRate.problems(label, "start_rate")...)
	if p.StartRate != nil && p.Scope != ScopeCluster {
		add("%s: start_rate needs scope: %s (starts are counted across processes by the cluster-wide gate)", label, ScopeCluster)
	}
	return out
}

// HasDoor reports whether anything is checked at the pool's door when a
// job is enqueued (a backlog limit or an enqueue rate).
func (p PoolConfig) HasDoor() bool {
	return p.MaxBacklog > 0 || p.EnqueueRate != nil || p.EnqueueRatePerKey != nil || len(p.JobTypeRates) > 0
}

// tierLimit returns the backlog limit of a tier (defaults filled; 0:
// unbounded).
func (p PoolConfig) tierLimit(tier string) int {
	if l, ok := p.TierLimits[tier]; ok {
		return l
	}
	return p.MaxBacklog
}

// ErrRefused is matched by every enqueue the door refused: a full
// backlog (ErrBacklogFull) or a rate limit (ErrRateLimited). Nothing of
// the refused request was enqueued.
var ErrRefused = errors.New("refused at the door")

// ErrBacklogFull is matched by a *BacklogError.
var ErrBacklogFull = errors.New("pool backlog is full")

// ErrRateLimited is matched by a *RateLimitError.
var ErrRateLimited = errors.New("enqueue rate limit reached")

// TierRoom is the room a tier of a pool had for a refused request, and
// what the request needed.
type TierRoom struct {
	Tier string
	// Limit is the tier's backlog limit.
	Limit int
	// Room is how many more jobs of the tier the pool could admit: its
	// limit, less the backlog, less the jobs of the request's higher tiers
	// (admitted first) and of earlier waiting requests.
	Room int
	// Need is how many the request brought.
	Need int
}

// BacklogError is a request refused because a pool's backlog (jobs
// pending, scheduled or waiting for a retry) would pass a limit. It
// matches ErrBacklogFull and ErrRefused.
type BacklogError struct {
	Pool string
	// Tier is the first tier (highest first) whose room was too small; ""
	// for a pool without tiers.
	Tier string
	// Backlog is the pool's backlog when the request was refused, and Limit
	// the limit of Tier.
	Backlog, Limit int
	// Tiers lists, for each tier the request had jobs of, its room and
	// need, highest tier first.
	Tiers []TierRoom
	// Waited is how long the request waited for room (backlog_wait).
	Waited time.Duration
}

func (e *BacklogError) Error() string {
	var b strings.Builder
	if e.Tier == "" {
		fmt.Fprintf(&b, "pool %q is full: backlog %d/%d", e.Pool, e.Backlog, e.Limit)
	} else {
		fmt.Fprintf(&b, "pool %q is full for tier %q: backlog %d/%d", e.Pool, e.Tier, e.Backlog, e.Limit)
	}
	need := 0
	for _, t := range e.Tiers {
		need += t.Need
	}
	if need > 1 {
		parts := make([]string, len(e.Tiers))
		for i, t := range e.Tiers {
			name := t.Tier
			if name == "" {
				name = "jobs"
			}
			parts[i] = fmt.Sprintf("%s: room %d, needs %d", name, t.Room, t.Need)
		}
		fmt.Fprintf(&b, "; the request needs %d (%s)", need, strings.Join(parts, "; "))
	} else if len(e.Tiers) == 1 && e.Tiers[0].Room > 0 {
		// Room by the count, but held for requests that waited first.
		fmt.Fprintf(&b, "; the room left is held for earlier waiting requests")
	}
	if e.Waited > 0 {
		fmt.Fprintf(&b, "; waited %s", e.Waited.Round(time.Millisecond))
	}
	return b.String() + "; nothing was enqueued"
}

func (e *BacklogError) Is(target error) bool {
	return target == ErrBacklogFull || target == ErrRefused
}

// RateLimitError is a request refused by an enqueue rate limit. It matches
// ErrRateLimited and ErrRefused.
type RateLimitError struct {
	Pool string
	// Limit names the limit: "enqueue_rate", "enqueue_rate_per_key" or
	// "job_type_rates".
	Limit string
	// JobType is set for a job type's limit; Key for a caller key's.
	JobType, Key string
	Rate         Rate
	// Need is how many jobs the request brought under this limit.
	Need int
	// RetryAfter is how long until the request would pass, if nothing else
	// is enqueued meanwhile; 0 when it never can (it needs more than the
	// burst).
	RetryAfter time.Duration
}

func (e *RateLimitError) Error() string {
	what := e.Limit
	switch {
	case e.JobType != "":
		what = fmt.Sprintf("%s of job type %q", e.Limit, e.JobType)
	case e.Key != "":
		what = fmt.Sprintf("%s for key %q", e.Limit, e.Key)
	}
	if e.RetryAfter <= 0 {
		return fmt.Sprintf("pool %q: %s %s: the request brings %d jobs, more than the burst: it can never pass; split it; nothing was enqueued", e.Pool, what, e.Rate, e.Need)
	}
	return fmt.Sprintf("pool %q: %s %s reached; retry after %s; nothing was enqueued", e.Pool, what, e.Rate, e.RetryAfter.Round(time.Millisecond))
}

func (e *RateLimitError) Is(target error) bool {
	return target == ErrRateLimited || target == ErrRefused
}
