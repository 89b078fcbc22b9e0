package rdb

import "strings"

// Member names a job in the engine's sets (the gate's leases and waiters,
// a breaker's suspects, probes and failure counts): its ID and its queue,
// because the same ID may be used in two pools.
type Member struct{ ID, Queue string }

// String is the member as stored: <id>@<queue>.
func (m Member) String() string { return m.ID + "@" + m.Queue }

// ParseMember reads a stored member; ok is false when s has no '@'. Queue
// names hold no '@' (their pattern), so the last '@' separates them.
func ParseMember(s string) (m Member, ok bool) {
	i := strings.LastIndexByte(s, '@')
	if i < 0 {
		return Member{}, false
	}
	return Member{ID: s[:i], Queue: s[i+1:]}, true
}

// Pause markers: the value the gate and a breaker write in asynq's pause
// key of a queue, so that each lifts only the pauses it set, never an
// operator's (asynq's own tools set the time).
const (
	GatePause    = "compartment-gate"
	BreakerPause = "compartment-breaker"
)
