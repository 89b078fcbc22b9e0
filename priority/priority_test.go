package priority_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/priority"
)

func TestShippedPrioritiesFile(t *testing.T) {
	p, err := priority.Load(apptest.RepoPath("configs/priorities.yaml"))
	require.NoError(t, err)
	require.Equal(t, []string{"regulatory", "close", "management", "adhoc"}, p.Tiers())
	require.Equal(t, "adhoc", p.Default())
}

func TestResolve(t *testing.T) {
	p, err := priority.Parse([]byte(`
tiers: [regulatory, close, adhoc]
default: adhoc
reports:
  vat-return: regulatory
  trial-balance: close
`))
	require.NoError(t, err)

	cases := []struct {
		name, report, explicit, want string
	}{
		{"mapping", "vat-return", "", "regulatory"},
		{"default for an unmapped report", "one-off", "", "adhoc"},
		{"explicit beats mapping", "vat-return", "adhoc", "adhoc"},
		{"explicit for an unmapped report", "one-off", "close", "close"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.Resolve(tc.report, tc.explicit)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}

	_, err = p.Resolve("vat-return", "urgent")
	require.ErrorIs(t, err, priority.ErrUnknownTier)
	require.EqualError(t, err, `priority: unknown tier "urgent" (tiers, highest first: ["regulatory" "close" "adhoc"])`)

	r, err := p.Rank("close")
	require.NoError(t, err)
	require.Equal(t, 1, r)
	_, err = p.Rank("nope")
	require.ErrorIs(t, err, priority.ErrUnknownTier)

	require.Equal(t, []string{"regulatory", "close", "adhoc"}, p.Order([]string{"adhoc", "regulatory", "close"}))
	require.Equal(t, []string{"trial-balance", "vat-return"}, p.Reports())
}

// Reordering tiers is a config edit: the same reports resolve to the same
// tiers, and the order follows the file.
func TestOrderComesFromTheFile(t *testing.T) {
	p, err := priority.Parse([]byte("tiers: [adhoc, regulatory]\ndefault: adhoc\n"))
	require.NoError(t, err)
	require.Equal(t, []string{"adhoc", "regulatory"}, p.Order([]string{"regulatory", "adhoc"}))
}

func TestInvalidFiles(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want []string
	}{
		{"empty file", ``, []string{"the file is empty"}},
		{"unknown key", "tiers: [a]\ndefault: a\npriority: high\n", []string{"field priority not found"}},
		{"empty tier list", "tiers: []\ndefault: a\n", []string{
			"tiers: the list must name at least one tier",
			`default: tier "a" is not in tiers []`,
		}},
		{"duplicate tier", "tiers: [a, b, a]\ndefault: a\n", []string{`tiers: tier "a" is listed twice`}},
		{"bad tier name", "tiers: [\"Close Books\"]\ndefault: \"Close Books\"\n", []string{`tiers: tier "Close Books": a name must match`}},
		{"missing default", "tiers: [a]\n", []string{"default: a default tier is required"}},
		{"unknown default", "tiers: [a]\ndefault: b\n", []string{`default: tier "b" is not in tiers ["a"]`}},
		{"report to unknown tier", "tiers: [a]\ndefault: a\nreports:\n  vat: z\n", []string{`reports: report "vat": tier "z" is not in tiers ["a"]`}},
		{"report name with a path", "tiers: [a]\ndefault: a\nreports:\n  ../etc/passwd: a\n", []string{`reports: report name "../etc/passwd" is invalid`}},
		{"two documents", "tiers: [a]\ndefault: a\n---\ntiers: [b]\n", []string{"a second YAML document is not allowed"}},
		{"malformed yaml", "tiers: [a\n", []string{"yaml:"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := priority.Parse([]byte(tc.yaml))
			require.Nil(t, p)
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestValidateReportName(t *testing.T) {
	for _, ok := range []string{"vat-return", "ar_aging", "Q4.summary", "r2"} {
		require.NoError(t, priority.ValidateReportName(ok), ok)
	}
	for _, bad := range []string{"", "a/b", `a\b`, "..", "a..b", ".hidden", "with space", "-flag"} {
		require.Error(t, priority.ValidateReportName(bad), bad)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := priority.Load(filepath.Join(t.TempDir(), "nope.yaml"))
	require.ErrorContains(t, err, "priorities: open ")
}

func TestInversions(t *testing.T) {
	p, err := priority.Parse([]byte("tiers: [regulatory, close, adhoc]\ndefault: adhoc\n"))
	require.NoError(t, err)
	for _, tc := range []struct {
		order []string
		want  int
	}{
		{nil, 0},
		{[]string{"regulatory", "regulatory", "close", "adhoc"}, 0},
		{[]string{"close", "adhoc"}, 0},
		{[]string{"close", "regulatory", "adhoc", "close", "regulatory"}, 3},
	} {
		require.Equal(t, tc.want, p.Inversions(tc.order), "%v", tc.order)
	}
}
