package reports_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/reports"
)

func TestShippedCatalogAndPlan(t *testing.T) {
	cat, err := reports.LoadCatalog(apptest.RepoPath("configs/reports.yaml"))
	require.NoError(t, err)
	require.Contains(t, cat.Names(), "vat-return")
	pol, err := reports.LoadPriorities(apptest.RepoPath("configs/priorities.yaml"))
	require.NoError(t, err)
	for _, name := range pol.Names() {
		_, ok := cat.Get(name)
		require.Truef(t, ok, "priorities map %q, which the catalog lacks", name)
	}
	plan, err := reports.LoadPlan(apptest.RepoPath("configs/month-end.yaml"), "2026-10", cat, pol)
	require.NoError(t, err)
	require.Len(t, plan.Entries, len(cat.Names()))
	require.Equal(t, reports.PlannedReport{Name: "vat-return", Tier: "regulatory"}, plan.Entries[0])
}

func TestParsePeriod(t *testing.T) {
	p, err := reports.ParsePeriod("2026-02")
	require.NoError(t, err)
	require.Equal(t, "2026-02", p.String())
	require.Equal(t, "2026-02-01T00:00:00Z", p.Start().Format("2006-01-02T15:04:05Z07:00"))
	require.Equal(t, "2026-03-01T00:00:00Z", p.End().Format("2006-01-02T15:04:05Z07:00"))
	require.Equal(t, "vat_2026-02.csv", reports.FileName("vat", p))
	for _, bad := range []string{"", "2026-13", "2026-1", "26-10", "2026/10", "2026-10-01", "October"} {
		_, err := reports.ParsePeriod(bad)
		require.EqualErrorf(t, err, `period "`+bad+`" must be a month written YYYY-MM, like 2026-10`, bad)
	}
}

func TestCatalogMistakes(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"empty", "reports: []\n", []string{"reports: the catalog lists no reports"}},
		{"unknown key", "reports:\n  - name: a\n    query: x $1 $2\n    owner: bob\n", []string{"unknown key reports[0].owner"}},
		{"bad name", "reports:\n  - name: ../etc\n    query: x $1 $2\n", []string{`reports[0]: report name "../etc" is invalid`}},
		{"duplicate", "reports:\n  - name: a\n    query: x $1 $2\n  - name: a\n    query: y $1 $2\n", []string{`report "a": listed twice`}},
		{"no query", "reports:\n  - name: a\n", []string{`report "a": query is required`}},
		{"no period parameters", "reports:\n  - name: a\n    query: SELECT 1\n", []string{`report "a": query must use $1 (start of the month) and $2`}},
		{"bad format", "reports:\n  - name: a\n    query: x $1 $2\n    format: xlsx\n", []string{`report "a": format must be "csv", got "xlsx"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := reports.ParseCatalog([]byte(tc.yaml))
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestPlanMistakesListEveryProblem(t *testing.T) {
	cat, err := reports.ParseCatalog([]byte("reports:\n  - name: vat\n    query: x $1 $2\n  - name: tb\n    query: x $1 $2\n"))
	require.NoError(t, err)
	pol, err := reports.ParsePriorities([]byte("tiers: [regulatory, adhoc]\ndefault: adhoc\nreports: {vat: regulatory}\n"))
	require.NoError(t, err)

	plan, err := reports.ParsePlan([]byte("reports:\n  - name: vat\n  - name: tb\n    tier: regulatory\n"), "2026-10", cat, pol)
	require.NoError(t, err)
	require.Equal(t, []reports.PlannedReport{{Name: "vat", Tier: "regulatory"}, {Name: "tb", Tier: "regulatory"}}, plan.Entries)

	_, err = reports.ParsePlan([]byte(`reports:
  - name: vat
  - name: payroll
  - name: tb
    tier: urgent
  - name: vat
`), "2026-13", cat, pol)
	require.Error(t, err)
	msg := err.Error()
	for _, w := range []string{
		`period "2026-13" must be a month written YYYY-MM`,
		`reports[1] "payroll": unknown report (catalog: ["vat" "tb"])`,
		`reports[2] "tb": priority: unknown tier "urgent"`,
		`reports[3] "vat": listed twice (also reports[0])`,
	} {
		require.Contains(t, msg, w)
	}

	_, err = reports.ParsePlan([]byte("reports: []\n"), "2026-10", cat, pol)
	require.EqualError(t, err, "reports: the plan lists no reports")
	_, err = reports.ParsePlan([]byte("reprots: []\n"), "2026-10", cat, pol)
	require.ErrorContains(t, err, "unknown key reprots")
	_, err = reports.LoadPlan(filepath.Join(t.TempDir(), "none.yaml"), "2026-10", cat, pol)
	require.ErrorContains(t, err, "plan: open ")
}
