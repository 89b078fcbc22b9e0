package database

import (
	"context"
	"sync"
	"time"
)

// The report database can be made slow on purpose, for the tests, the
// bench and the demo's third act (docs/DEPENDENCIES.md): SetSlowdown turns
// on a model of a database server that runs capacity report queries at
// full speed and shares itself among more, as a server with that many
// cores does: a report that runs while n reports run takes its time times
// n ÷ capacity, when that is over 1. A slowdown of f divides the capacity
// by f, as a database that lost four fifths of its I/O does for f = 5: at
// the load it had (capacity reports at once) every report takes f times
// longer, and fewer at once run faster. The model works the same on SQLite
// and PostgreSQL: it stretches the time a report holds its connection
// beyond its query (HoldReport, which report_min_duration already uses to
// stand in for a month-end's heavy queries), nothing else; order and
// search queries are not touched.

// serverModel is the report server's state.
type serverModel struct {
	mu       sync.Mutex
	capacity float64 // reports at full speed; 0: the model is off
	slowdown float64
	active   int
}

// SetSlowdown turns the report server model on, with capacity reports at
// full speed divided by factor (1: at full health). capacity 0 turns it
// off.
func (db *DB) SetSlowdown(capacity int, factor float64) {
	db.server.mu.Lock()
	defer db.server.mu.Unlock()
	db.server.capacity = float64(capacity)
	db.server.slowdown = max(1, factor)
}

// Slowdown returns the model's factor (1 when it is off or at full
// health).
func (db *DB) Slowdown() float64 {
	db.server.mu.Lock()
	defer db.server.mu.Unlock()
	if db.server.capacity == 0 {
		return 1
	}
	return db.server.slowdown
}

// BeginReport counts a report among those the database runs, until end
// is called.
func (db *DB) BeginReport() (end func()) {
	s := &db.server
	s.mu.Lock()
	s.active++
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.active--
			s.mu.Unlock()
		})
	}
}

// HoldReport holds a report that began at start (BeginReport) until at
// least least of work is done, its work so far being the time since start
// at full speed; the server model (SetSlowdown) stretches what is left as
// long as the report runs. Without the model it holds until start + least.
// It returns early with ctx's cause.
func (db *DB) HoldReport(ctx context.Context, start time.Time, least time.Duration) error {
	s := &db.server
	// Progress is integrated in small steps, so a report slows and speeds
	// up with the reports around it.
	const step = 10 * time.Millisecond
	done := time.Since(start)
	for done < least {
		s.mu.Lock()
		speed := 1.0
		if s.capacity > 0 && s.active > 0 {
			speed = min(1, s.capacity/s.slowdown/float64(s.active))
		}
		s.mu.Unlock()
		wait := min(step, time.Duration(float64(least-done)/speed)+time.Millisecond)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
		done += time.Duration(float64(wait) * speed)
	}
	return nil
}
