package schedule_test

import (
	"fmt"
	"time"

	"github.com/lci-labs/compartment/internal/schedule"
)

// A daily 02:30 schedule in Berlin around the day clocks go forward
// (29 March 2026, when 02:30 does not exist) and the day they go back
// (25 October 2026, when it happens twice): one run each day.
func ExampleSchedule_Next() {
	s, err := schedule.New(schedule.Spec{Name: "daily", Cron: "30 2 * * *", Timezone: "Europe/Berlin"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, from := range []time.Time{
		time.Date(2026, 3, 27, 12, 0, 0, 0, s.Location),
		time.Date(2026, 10, 23, 12, 0, 0, 0, s.Location),
	} {
		t := from
		for range 3 {
			t = s.Next(t)
			fmt.Println(t.In(s.Location).Format("Mon 2006-01-02 15:04 MST"), "covers", s.PeriodFor(t))
		}
	}
	// Output:
	// Sat 2026-03-28 02:30 CET covers 2026-02
	// Sun 2026-03-29 03:00 CEST covers 2026-02
	// Mon 2026-03-30 02:30 CEST covers 2026-02
	// Sat 2026-10-24 02:30 CEST covers 2026-09
	// Sun 2026-10-25 02:30 CEST covers 2026-09
	// Mon 2026-10-26 02:30 CET covers 2026-09
}
