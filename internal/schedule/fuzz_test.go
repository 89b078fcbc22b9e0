package schedule_test

import (
	"testing"
	"time"

	"github.com/lci-labs/compartment/internal/schedule"
)

// FuzzSchedule feeds arbitrary cron text and zones to New: it must never
// panic, and an accepted schedule's fire times must strictly increase.
func FuzzSchedule(f *testing.F) {
	f.Add("0 2 1 * *", "Europe/Berlin", int64(1793494800))
	f.Add("30 2 * * *", "America/New_York", int64(1772953200))
	f.Add("*/7 1-3 * * mon-fri", "Australia/Lord_Howe", int64(1775318400))
	f.Add("@monthly", "UTC", int64(0))
	f.Add("0 0 30 2 *", "UTC", int64(0))
	f.Add("0-0/0 * * * *", "Asia/Kolkata", int64(-1))
	f.Fuzz(func(t *testing.T, expr, zone string, unix int64) {
		s, err := schedule.New(schedule.Spec{Name: "f", Cron: expr, Timezone: zone})
		if err != nil {
			return
		}
		from := time.Unix(unix%(1<<34), 0)
		prev := from
		for range 50 {
			next := s.Next(prev)
			if next.IsZero() {
				return
			}
			if !next.After(prev) {
				t.Fatalf("%q in %s: Next(%s) = %s, not after it", expr, zone, prev, next)
			}
			prev = next
		}
	})
}
