package demo

import "testing"

func TestInversions(t *testing.T) {
	tiers := []string{"regulatory", "close", "adhoc"}
	starts := func(ts ...string) []ReportStart {
		out := make([]ReportStart, len(ts))
		for i, tier := range ts {
			out[i] = ReportStart{Tier: tier}
		}
		return out
	}
	for _, tc := range []struct {
		order []string
		want  int
	}{
		{[]string{"regulatory", "regulatory", "close", "adhoc"}, 0},
		{[]string{"close", "adhoc"}, 0},
		{[]string{"close", "regulatory", "adhoc", "close", "regulatory"}, 3},
	} {
		if got := inversions(starts(tc.order...), tiers); got != tc.want {
			t.Errorf("inversions(%v) = %d, want %d", tc.order, got, tc.want)
		}
	}
}
