package schedule_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/schedule"
	"github.com/lci-labs/compartment/internal/testleak"
)

func TestMain(m *testing.M) { testleak.VerifyMain(m) }

func mustNew(t *testing.T, spec schedule.Spec) *schedule.Schedule {
	t.Helper()
	s, err := schedule.New(spec)
	require.NoError(t, err)
	return s
}

func at(t *testing.T, zone, value string) time.Time {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	require.NoError(t, err)
	v, err := time.ParseInLocation("2006-01-02 15:04", value, loc)
	require.NoError(t, err)
	return v
}

func sameInstant(t *testing.T, want, got time.Time) {
	t.Helper()
	require.True(t, want.Equal(got), "want %s, got %s", want, got)
}

// fires lists the fire times in [from, to).
func fires(s *schedule.Schedule, from, to time.Time) []time.Time {
	var out []time.Time
	for f := s.Next(from.Add(-time.Nanosecond)); !f.IsZero() && f.Before(to); f = s.Next(f) {
		out = append(out, f)
	}
	return out
}

func TestNewNamesEveryProblem(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		spec schedule.Spec
		want []string
	}{
		{"bad cron", schedule.Spec{Name: "m", Cron: "0 2 32 * *"}, []string{`cron "0 2 32 * *": end of range (32) above maximum (31): 32`}},
		{"six fields", schedule.Spec{Name: "m", Cron: "0 0 2 1 * *"}, []string{`cron "0 0 2 1 * *": expected exactly 5 fields, found 6`}},
		{"never fires", schedule.Spec{Name: "m", Cron: "0 2 30 2 *"}, []string{`cron "0 2 30 2 *" never fires`}},
		{"missing cron", schedule.Spec{Name: "m"}, []string{"cron is required"}},
		{"zone in the expression", schedule.Spec{Name: "m", Cron: "TZ=UTC 0 2 1 * *"}, []string{"set the zone with timezone:"}},
		{"@every", schedule.Spec{Name: "m", Cron: "@every 1h"}, []string{"@every is not a calendar schedule"}},
		{"unknown zone", schedule.Spec{Name: "m", Cron: "0 2 1 * *", Timezone: "Mars/Olympus_Mons"}, []string{`timezone "Mars/Olympus_Mons": unknown time zone`}},
		{"Local zone", schedule.Spec{Name: "m", Cron: "0 2 1 * *", Timezone: "Local"}, []string{`timezone "Local": unknown time zone`}},
		{"bad period", schedule.Spec{Name: "m", Cron: "0 2 1 * *", Period: "last"}, []string{`period "last": use previous`}},
		{"short catch-up", schedule.Spec{Name: "m", Cron: "0 2 1 * *", CatchUp: time.Second}, []string{"catch_up must be at least 1m0s, got 1s"}},
		{"negative catch-up", schedule.Spec{Name: "m", Cron: "0 2 1 * *", CatchUp: -time.Hour}, []string{"catch_up must be at least 1m0s, got -1h0m0s"}},
		{"long catch-up", schedule.Spec{Name: "m", Cron: "0 2 1 * *", CatchUp: 800 * time.Hour}, []string{"catch_up must be at most 744h0m0s (31 days), got 800h0m0s"}},
		{"bad name", schedule.Spec{Name: "Month End", Cron: "0 2 1 * *"}, []string{`name "Month End" may hold only a-z, 0-9, _ and -`}},
		{"no name", schedule.Spec{Cron: "0 2 1 * *"}, []string{"name is required"}},
		{"all at once", schedule.Spec{Name: "m", Cron: "61 * * * *", Timezone: "Nowhere", Period: "next"},
			[]string{`cron "61 * * * *"`, `timezone "Nowhere"`, `period "next"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := schedule.New(tc.spec)
			require.Error(t, err)
			require.True(t, errors.Is(err, schedule.ErrInvalid))
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	s := mustNew(t, schedule.Spec{Name: "month-end", Cron: "@monthly"})
	require.Equal(t, "UTC", s.Timezone)
	require.Equal(t, schedule.PeriodPrevious, s.Period)
	require.Equal(t, schedule.DefaultCatchUp, s.CatchUp)
	sameInstant(t, at(t, "UTC", "2026-12-01 00:00"), s.Next(at(t, "UTC", "2026-11-01 00:00")))
}

func TestPeriodFollowsTheZone(t *testing.T) {
	t.Parallel()
	// 00:30 on 1 November in Berlin is still 31 October in UTC: the period
	// is taken from the schedule's own calendar.
	berlin := mustNew(t, schedule.Spec{Name: "m", Cron: "30 0 1 * *", Timezone: "Europe/Berlin"})
	fire := berlin.Next(at(t, "UTC", "2026-10-15 00:00"))
	sameInstant(t, at(t, "Europe/Berlin", "2026-11-01 00:30"), fire)
	require.Equal(t, "2026-10", berlin.PeriodFor(fire))
	current := mustNew(t, schedule.Spec{Name: "m", Cron: "30 0 1 * *", Timezone: "Europe/Berlin", Period: schedule.PeriodCurrent})
	require.Equal(t, "2026-11", current.PeriodFor(fire))
	jan := mustNew(t, schedule.Spec{Name: "m", Cron: "0 2 1 * *"})
	require.Equal(t, "2025-12", jan.PeriodFor(jan.Next(at(t, "UTC", "2025-12-31 12:00"))))
}

// TestDaylightSavingDaily fires a 02:30 daily schedule across both of a
// year's clock changes: exactly one run each local day, at 02:30 where it
// exists and at the end of the gap where it does not.
func TestDaylightSavingDaily(t *testing.T) {
	t.Parallel()
	cases := []struct {
		zone, spring, fall string // the dates clocks go forward and back (2026)
		springFire         string // where the skipped 02:30 fires
		fallZone           string // the zone abbreviation of the day's one 02:30
	}{
		// Berlin repeats 02:00-03:00: 02:30 fires at its first occurrence.
		{"Europe/Berlin", "2026-03-29", "2026-10-25", "2026-03-29 03:00", "CEST"},
		// New York repeats 01:00-02:00, so its 02:30 happens once.
		{"America/New_York", "2026-03-08", "2026-11-01", "2026-03-08 03:00", "EST"},
	}
	for _, tc := range cases {
		t.Run(tc.zone, func(t *testing.T) {
			s := mustNew(t, schedule.Spec{Name: "m", Cron: "30 2 * * *", Timezone: tc.zone})
			for _, day := range []string{tc.spring, tc.fall} {
				d := at(t, tc.zone, day+" 00:00")
				got := fires(s, d.AddDate(0, 0, -2), d.AddDate(0, 0, 3))
				require.Len(t, got, 5, "one run per day around %s: %v", day, got)
				for i, f := range got {
					local := f.In(s.Location)
					require.Equal(t, d.AddDate(0, 0, i-2).Day(), local.Day(), "run %d on its own day: %v", i, got)
					if i > 0 {
						gap := f.Sub(got[i-1])
						require.True(t, gap >= 23*time.Hour && gap <= 25*time.Hour, "runs %v apart", gap)
					}
				}
			}
			sameInstant(t, at(t, tc.zone, tc.springFire), s.Next(at(t, tc.zone, tc.spring+" 00:00")))
			fall := s.Next(at(t, tc.zone, tc.fall+" 00:00"))
			require.Equal(t, "02:30 "+tc.fallZone, fall.In(s.Location).Format("15:04 MST"))
		})
	}
	t.Run("repeated hour fires at its first occurrence", func(t *testing.T) {
		s := mustNew(t, schedule.Spec{Name: "m", Cron: "30 1 * * *", Timezone: "America/New_York"})
		d := at(t, "America/New_York", "2026-11-01 00:00")
		got := fires(s, d, d.AddDate(0, 0, 1))
		require.Len(t, got, 1)
		require.Equal(t, "01:30 EDT", got[0].In(s.Location).Format("15:04 MST"))
	})
}

// TestDaylightSavingHourly: an hourly schedule fires once per wall-clock
// hour that exists; the skipped hour's run merges into the next, the
// repeated hour fires once.
func TestDaylightSavingHourly(t *testing.T) {
	t.Parallel()
	s := mustNew(t, schedule.Spec{Name: "m", Cron: "0 * * * *", Timezone: "Europe/Berlin"})
	spring := fires(s, at(t, "Europe/Berlin", "2026-03-29 00:00"), at(t, "Europe/Berlin", "2026-03-30 00:00"))
	require.Len(t, spring, 23)
	fall := fires(s, at(t, "Europe/Berlin", "2026-10-25 00:00"), at(t, "Europe/Berlin", "2026-10-26 00:00"))
	require.Len(t, fall, 24, "each of the day's 24 wall-clock hours once, the repeated 02:00 once")
	seen := map[string]bool{}
	for _, f := range fall {
		h := f.In(s.Location).Format("15:04")
		require.False(t, seen[h], "wall time %s fired twice", h)
		seen[h] = true
	}
	// Strictly increasing, never the same instant twice.
	for _, list := range [][]time.Time{spring, fall} {
		for i := 1; i < len(list); i++ {
			require.True(t, list[i].After(list[i-1]))
		}
	}
}

func TestLatest(t *testing.T) {
	t.Parallel()
	s := mustNew(t, schedule.Spec{Name: "m", Cron: "0 2 * * *"})
	now := at(t, "UTC", "2026-11-03 01:00")
	got, ok := s.Latest(now.Add(-48*time.Hour), now)
	require.True(t, ok)
	sameInstant(t, at(t, "UTC", "2026-11-02 02:00"), got)
	_, ok = s.Latest(now.Add(-time.Hour), now)
	require.False(t, ok)
	// The window is (from, to]: a fire at exactly "to" is in it.
	got, ok = s.Latest(now, at(t, "UTC", "2026-11-03 02:00"))
	require.True(t, ok)
	sameInstant(t, at(t, "UTC", "2026-11-03 02:00"), got)
}
