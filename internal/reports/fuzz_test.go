package reports_test

import (
	"testing"

	"github.com/lci-labs/compartment/internal/reports"
)

// FuzzPlan feeds arbitrary plan files and periods to the plan parser: it
// must never panic, and a plan it accepts has known reports, each once, at
// known tiers, for a well-formed period.
func FuzzPlan(f *testing.F) {
	cat, err := reports.ParseCatalog([]byte("reports:\n  - name: vat\n    query: x $1 $2\n  - name: tb\n    query: y $1 $2\n"))
	if err != nil {
		f.Fatal(err)
	}
	pol, err := reports.ParsePriorities([]byte("tiers: [regulatory, adhoc]\ndefault: adhoc\nreports: {vat: regulatory}\n"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte("reports:\n  - name: vat\n  - name: tb\n    tier: regulatory\n"), "2026-10")
	f.Add([]byte("reports:\n  - name: vat\n  - name: vat\n"), "2026-13")
	f.Add([]byte("reports: [{name: ../x}]\n"), "")
	f.Add([]byte("reports: []\n---\nreports: []\n"), "2026-1")
	f.Fuzz(func(t *testing.T, data []byte, period string) {
		plan, err := reports.ParsePlan(data, period, cat, pol)
		if err != nil {
			return
		}
		if plan.Period.String() != period {
			t.Fatalf("period %q accepted as %q", period, plan.Period)
		}
		seen := map[string]bool{}
		for _, e := range plan.Entries {
			if _, ok := cat.Get(e.Name); !ok || seen[e.Name] || !pol.Has(e.Tier) {
				t.Fatalf("accepted a bad entry %+v", e)
			}
			seen[e.Name] = true
		}
	})
}
