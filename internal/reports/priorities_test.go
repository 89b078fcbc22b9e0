package reports_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/reports"
)

func TestShippedPrioritiesFile(t *testing.T) {
	p, err := reports.LoadPriorities(apptest.RepoPath("configs/priorities.yaml"))
	require.NoError(t, err)
	require.Equal(t, []string{"regulatory", "close", "management", "adhoc"}, p.Tiers())
	require.Equal(t, "adhoc", p.Default())
	tier, err := p.Resolve("vat-return", "")
	require.NoError(t, err)
	require.Equal(t, "regulatory", tier)
}

func TestInvalidPrioritiesFiles(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want []string
	}{
		{"empty file", ``, []string{"the file is empty"}},
		{"unknown key", "tiers: [a]\ndefault: a\npriority: high\n", []string{"line 3: unknown key priority (the keys here are tiers, default, reports)"}},
		{"empty tier list", "tiers: []\ndefault: a\n", []string{
			"tiers: the list must name at least one tier",
			`default: tier "a" is not in tiers []`,
		}},
		{"duplicate tier", "tiers: [a, b, a]\ndefault: a\n", []string{`tiers: tier "a" is listed twice`}},
		{"missing default", "tiers: [a]\n", []string{"default: a default tier is required"}},
		{"report to unknown tier", "tiers: [a]\ndefault: a\nreports:\n  vat: z\n", []string{`reports: report "vat": tier "z" is not in tiers ["a"]`}},
		{"report name with a path", "tiers: [a]\ndefault: a\nreports:\n  ../etc/passwd: a\n", []string{`reports: report name "../etc/passwd" is invalid`}},
		{"two documents", "tiers: [a]\ndefault: a\n---\ntiers: [b]\n", []string{"a second YAML document is not allowed"}},
		{"malformed yaml", "tiers: [a\n", []string{"yaml:"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := reports.ParsePriorities([]byte(tc.yaml))
			require.Nil(t, p)
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"vat-return", "ar_aging", "Q4.summary", "r2"} {
		require.NoError(t, reports.ValidateName(ok), ok)
	}
	for _, bad := range []string{"", "a/b", `a\b`, "..", "a..b", ".hidden", "with space", "-flag"} {
		require.Error(t, reports.ValidateName(bad), bad)
	}
}

func TestLoadPrioritiesMissingOrHugeFile(t *testing.T) {
	dir := t.TempDir()
	_, err := reports.LoadPriorities(filepath.Join(dir, "nope.yaml"))
	require.ErrorContains(t, err, "priorities: open ")

	big := filepath.Join(dir, "big.yaml")
	require.NoError(t, os.WriteFile(big, make([]byte, 5<<20), 0o600))
	_, err = reports.LoadPriorities(big)
	require.ErrorContains(t, err, "larger than the limit of 4 MiB")
}
