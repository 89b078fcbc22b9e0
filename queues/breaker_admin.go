package queues

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// BreakerState is a pool's circuit breaker as Redis holds it, shared by
// every worker process.
type BreakerState struct {
	Pool string `json:"pool"`
	// State is BreakerClosed, BreakerOpen or BreakerHalfOpen.
	State BreakerStatus `json:"state"`
	// Forced is BreakerOpen or BreakerClosed while an operator holds the
	// breaker in that state (until a reset), or empty.
	Forced BreakerStatus `json:"forced,omitempty"`
	// Since is when the breaker entered State (by Redis's clock); zero if
	// it never left its first closed state.
	Since time.Time `json:"since,omitzero"`
	// Why says what moved it there.
	Why string `json:"why,omitempty"`
	// ReopensAt is when an open breaker lets probes through; zero when it
	// is not open or stays open until an operator acts.
	ReopensAt time.Time `json:"reopens_at,omitzero"`
	// CoolDown is the cool-down of the last opening (it doubles with each
	// failed probe, up to max_cool_down).
	CoolDown time.Duration `json:"cool_down,omitempty"`
	// Trips counts the openings in a row without a close in between.
	Trips int `json:"trips,omitempty"`
	// Calls, Failures and Slow are the counts that drove the last change of
	// state.
	Calls    int `json:"calls"`
	Failures int `json:"failures"`
	Slow     int `json:"slow"`
	// WindowCalls, WindowFailures and WindowSlow are counted now, over the
	// window (while closed).
	WindowCalls    int `json:"window_calls"`
	WindowFailures int `json:"window_failures"`
	WindowSlow     int `json:"window_slow"`
	// ProbesRunning and ProbesSucceeded count the probes of a half-open
	// breaker.
	ProbesRunning   int `json:"probes_running,omitempty"`
	ProbesSucceeded int `json:"probes_succeeded,omitempty"`
}

// ErrNoBreaker is matched by a breaker command for a pool without one.
var ErrNoBreaker = errors.New("pool has no circuit breaker (breaker in its config)")

// BreakerAction is what an operator can do to a circuit breaker
// (Client.ForceBreaker).
type BreakerAction string

// Breaker actions.
const (
	// BreakerForceOpen opens it until a close or reset.
	BreakerForceOpen BreakerAction = "open"
	// BreakerForceClose closes it and keeps it from tripping until a
	// reset.
	BreakerForceClose BreakerAction = "close"
	// BreakerReset closes it and makes it count afresh.
	BreakerReset BreakerAction = "reset"
)

// BreakerActions lists every BreakerAction.
var BreakerActions = []BreakerAction{BreakerForceOpen, BreakerForceClose, BreakerReset}

// Breaker reads a pool's circuit breaker. It fails with ErrNoBreaker for a
// pool without one.
func (c *Client) Breaker(ctx context.Context, pool string) (BreakerState, error) {
	p, err := c.breakerPool(pool)
	if err != nil {
		return BreakerState{}, err
	}
	return readBreaker(ctx, c, p)
}

// ForceBreaker applies an operator's action to a pool's circuit breaker,
// cluster-wide: BreakerForceOpen opens it (its queues are paused) until a
// close or reset; BreakerForceClose closes it (the breaker's pauses are
// lifted, an operator's stay) and keeps it from tripping until a reset;
// BreakerReset closes it and makes it count again from nothing. The action
// is logged, a change of state is reported to this client's
// Config.OnBreakerChange (the workers do not see it), and the breaker is
// returned as it stands after.
func (c *Client) ForceBreaker(ctx context.Context, pool string, action BreakerAction) (BreakerState, error) {
	p, err := c.breakerPool(pool)
	if err != nil {
		return BreakerState{}, err
	}
	switch action {
	case BreakerForceOpen, BreakerForceClose, BreakerReset:
	default:
		return BreakerState{}, fmt.Errorf("%w: breaker action must be %q, %q or %q, got %q", ErrInvalidRequest,
			BreakerForceOpen, BreakerForceClose, BreakerReset, action)
	}
	r, err := breakerScripts(c.rdb, c.ks, p).Force(ctx, rdb.Action(action))
	if err != nil {
		return BreakerState{}, err
	}
	c.cfg.Logger.Warn("circuit breaker", "pool", p.Name(), "component", "breaker", "from", r.From, "to", r.State, "why", r.Why)
	reportChanges(c.cfg.OnBreakerChange, p.Name(), r)
	return readBreaker(ctx, c, p)
}

func (c *Client) breakerPool(pool string) (*Pool, error) {
	p, err := c.pools().get(pool)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if p.cfg.Breaker == nil {
		return nil, fmt.Errorf("pool %q: %w", pool, ErrNoBreaker)
	}
	return p, nil
}

// readBreaker reads p's breaker in one script call.
func readBreaker(ctx context.Context, c *Client, p *Pool) (BreakerState, error) {
	rec, err := breakerScripts(c.rdb, c.ks, p).Read(ctx)
	if err != nil {
		return BreakerState{}, err
	}
	st := BreakerState{
		Pool: p.Name(), State: BreakerStatus(rec.State), Forced: BreakerStatus(rec.Forced), Since: rec.Since, Why: rec.Why,
		Calls: rec.Calls, Failures: rec.Failures, Slow: rec.Slow,
		ProbesSucceeded: rec.ProbesSucceeded, ProbesRunning: rec.ProbesRunning,
		WindowCalls: rec.WindowCalls, WindowFailures: rec.WindowFailures, WindowSlow: rec.WindowSlow,
	}
	if st.State == BreakerOpen {
		st.ReopensAt = rec.Until
	}
	if st.State != BreakerClosed {
		st.CoolDown, st.Trips = rec.CoolDown, rec.Trips
	}
	return st, nil
}
