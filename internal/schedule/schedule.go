// Package schedule fires month-end plans on cron schedules, exactly once
// across every worker process that shares a Redis: a run is identified by
// its schedule and its fire instant, and only the process that claims that
// run in Redis (atomically, with a lease) enqueues the plan and writes the
// run's record. Fire times follow the wall clock of the schedule's time
// zone; a daylight-saving change neither skips nor doubles a run (see
// Schedule.Next). The package knows nothing of reports: what a run does is
// a RunFunc the caller gives.
package schedule

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Period says which month a run covers, relative to its fire time in the
// schedule's time zone.
type Period string

const (
	// PeriodPrevious covers the month before the fire time: a run on
	// 1 November covers October. The default.
	PeriodPrevious Period = "previous"
	// PeriodCurrent covers the month of the fire time.
	PeriodCurrent Period = "current"
)

// DefaultCatchUp is how long after a missed fire time a run is still
// caught up, when a schedule does not say.
const DefaultCatchUp = 24 * time.Hour

// MinCatchUp is the shortest catch-up window: a worker wakes at a fire
// time a little late (scheduling, a busy Redis), and checks again once a
// minute, so a shorter window could miss a run that every worker saw.
const MinCatchUp = time.Minute

// MaxCatchUp is the longest catch-up window: a month. Every check walks
// the fire times inside the window, and a run missed for longer than a
// month is better started by a person (enqueue schedule run).
const MaxCatchUp = 31 * 24 * time.Hour

// Spec is a schedule as configured.
type Spec struct {
	// Name identifies the schedule in records, logs and commands:
	// [a-z0-9_-], at most 64 bytes. Required.
	Name string
	// Cron is a standard 5-field cron expression (minute hour
	// day-of-month month day-of-week) or a descriptor such as @monthly.
	// Required.
	Cron string
	// Timezone is the IANA zone the cron expression is read in. Defaults
	// to UTC.
	Timezone string
	// Period is which month a run covers. Defaults to PeriodPrevious.
	Period Period
	// CatchUp is how long after a fire time a run missed by every worker
	// is still run. Defaults to DefaultCatchUp; from MinCatchUp to
	// MaxCatchUp.
	CatchUp time.Duration
	// Disabled turns the schedule off without deleting it: it never fires
	// on its own, but can be run by hand.
	Disabled bool
}

// Schedule is a validated Spec, ready to compute fire times.
type Schedule struct {
	Spec
	// Location is the loaded time zone.
	Location *time.Location
	wall     *cron.SpecSchedule // matches wall-clock times, written as UTC
}

// ErrInvalid is matched by every error of New.
var ErrInvalid = errors.New("invalid schedule")

// maxNameLen bounds a schedule name, which becomes part of Redis keys.
const maxNameLen = 64

// parser reads the standard five fields and descriptors (@monthly, …).
var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// New validates spec, fills its defaults (on a copy) and returns the
// schedule. On failure the error matches ErrInvalid and lists every
// problem, each naming the field; the caller prefixes the schedule.
func New(spec Spec) (*Schedule, error) {
	s := &Schedule{Spec: spec}
	if s.Timezone == "" {
		s.Timezone = "UTC"
	}
	if s.Period == "" {
		s.Period = PeriodPrevious
	}
	if s.CatchUp == 0 {
		s.CatchUp = DefaultCatchUp
	}
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if err := ValidateName(s.Name); err != nil {
		add("%v", err)
	}
	switch {
	case strings.TrimSpace(s.Cron) == "":
		add("cron is required (five fields: minute hour day-of-month month day-of-week, like \"0 2 1 * *\")")
	default:
		w, err := parseWall(s.Cron)
		if err != nil {
			add("cron %q: %v", s.Cron, err)
		}
		s.wall = w
	}
	loc, err := loadLocation(s.Timezone)
	if err != nil {
		add("timezone %q: unknown time zone (use an IANA name such as Europe/Berlin or UTC)", s.Timezone)
	}
	s.Location = loc
	switch s.Period {
	case PeriodPrevious, PeriodCurrent:
	default:
		add("period %q: use previous (the month before the run) or current (the month of the run)", s.Period)
	}
	switch {
	case s.CatchUp < MinCatchUp:
		add("catch_up must be at least %s, got %s", MinCatchUp, s.CatchUp)
	case s.CatchUp > MaxCatchUp:
		add("catch_up must be at most %s (31 days), got %s", MaxCatchUp, s.CatchUp)
	}
	if s.wall != nil && s.Location != nil && s.Next(time.Now()).IsZero() {
		add("cron %q never fires (no date matches it within five years)", s.Cron)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrInvalid, strings.Join(problems, "; "))
	}
	return s, nil
}

// ValidateName checks a schedule name: [a-z0-9_-], 1 to 64 bytes.
func ValidateName(name string) error {
	if name == "" {
		return errors.New("name is required")
	}
	if len(name) > maxNameLen {
		return fmt.Errorf("name is longer than %d bytes", maxNameLen)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return fmt.Errorf("name %q may hold only a-z, 0-9, _ and -", name)
		}
	}
	return nil
}

// loadLocation loads an IANA zone; "Local" is refused, since every worker
// host would read it differently.
func loadLocation(name string) (*time.Location, error) {
	if name == "Local" {
		return nil, errors.New("Local differs from host to host")
	}
	return time.LoadLocation(name)
}

// parseWall parses a cron expression into a schedule over wall-clock
// times: it is evaluated in UTC, where every wall time exists exactly
// once, and Next maps its matches onto the real zone.
func parseWall(expr string) (*cron.SpecSchedule, error) {
	expr = strings.TrimSpace(expr)
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		return nil, errors.New("set the zone with timezone:, not in the expression")
	}
	if strings.HasPrefix(expr, "@every") {
		return nil, errors.New("@every is not a calendar schedule: its times would depend on when each worker started")
	}
	sch, err := parser.Parse(expr)
	if err != nil {
		return nil, err
	}
	spec, ok := sch.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("unsupported schedule %T", sch)
	}
	spec.Location = time.UTC
	return spec, nil
}

// Next returns the first fire time after t, or the zero time if there is
// none within five years (a cron like "0 0 30 2 *").
//
// The expression matches wall-clock times in the schedule's zone. A wall
// time that happens twice (the hour repeated when clocks go back) fires
// once, at its first occurrence; a wall time that does not exist (the hour
// skipped when clocks go forward) fires at the first instant after the
// gap. Several skipped times fire as one run. So a daily 02:30 schedule in
// Europe/Berlin fires once every day, at 03:00 on the day clocks go
// forward. (robfig/cron on its own skips that day and fires twice on the
// day clocks go back.)
func (s *Schedule) Next(t time.Time) time.Time {
	if s.wall == nil || s.Location == nil {
		return time.Time{}
	}
	// instant is monotonic in the wall time, and instant(wall(t)) <= t, so
	// every wall time whose instant is after t comes after wall(t).
	w := wallOf(t, s.Location)
	for {
		w = s.wall.Next(w)
		if w.IsZero() {
			return time.Time{}
		}
		if i := instant(w, s.Location); i.After(t) {
			return i
		}
	}
}

// Latest returns the latest fire time in (from, to], if any.
func (s *Schedule) Latest(from, to time.Time) (time.Time, bool) {
	var last time.Time
	for t := s.Next(from); !t.IsZero() && !t.After(to); t = s.Next(t) {
		last = t
	}
	return last, !last.IsZero()
}

// PeriodFor returns the month (YYYY-MM) a run fired at fire covers.
func (s *Schedule) PeriodFor(fire time.Time) string {
	local := fire.In(s.Location)
	first := time.Date(local.Year(), local.Month(), 1, 0, 0, 0, 0, time.UTC)
	if s.Period == PeriodPrevious {
		first = first.AddDate(0, -1, 0)
	}
	return first.Format("2006-01")
}

// wallOf returns the wall clock of t in loc, written as a UTC time.
func wallOf(t time.Time, loc *time.Location) time.Time {
	l := t.In(loc)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), l.Nanosecond(), time.UTC)
}

// instant maps a wall time (written as UTC) to the instant it happens in
// loc: the earlier one when it happens twice, the end of the gap when it
// does not happen.
func instant(w time.Time, loc *time.Location) time.Time {
	// The instant is w minus the zone's offset then; the offsets in force
	// a day either side cover both sides of any transition.
	var best time.Time
	for _, probe := range []time.Time{w.Add(-24 * time.Hour), w, w.Add(24 * time.Hour)} {
		_, off := probe.In(loc).Zone()
		i := w.Add(-time.Duration(off) * time.Second)
		if wallOf(i, loc).Equal(w) && (best.IsZero() || i.Before(best)) {
			best = i
		}
	}
	if !best.IsZero() {
		return best
	}
	// In a gap: read w with the offset before the gap; that instant is
	// past the transition, whose start is where the gap ends.
	_, before := w.Add(-24 * time.Hour).In(loc).Zone()
	start, _ := w.Add(-time.Duration(before) * time.Second).In(loc).ZoneBounds()
	return start
}
