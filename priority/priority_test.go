package priority_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/priority"
)

func mustNew(t *testing.T, c priority.Config) *priority.Policy {
	t.Helper()
	p, err := priority.New(c)
	require.NoError(t, err)
	return p
}

func TestResolve(t *testing.T) {
	t.Parallel()
	p := mustNew(t, priority.Config{
		Tiers:   []string{"regulatory", "close", "adhoc"},
		Default: "adhoc",
		Assign:  map[string]string{"vat-return": "regulatory", "trial-balance": "close"},
	})
	cases := []struct {
		name, key, explicit, want string
	}{
		{"assignment", "vat-return", "", "regulatory"},
		{"default for an unassigned name", "one-off", "", "adhoc"},
		{"explicit beats assignment", "vat-return", "adhoc", "adhoc"},
		{"explicit for an unassigned name", "one-off", "close", "close"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.Resolve(tc.key, tc.explicit)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}

	_, err := p.Resolve("vat-return", "urgent")
	require.ErrorIs(t, err, priority.ErrUnknownTier)
	require.EqualError(t, err, `priority: unknown tier "urgent" (tiers, highest first: ["regulatory" "close" "adhoc"])`)

	r, err := p.Rank("close")
	require.NoError(t, err)
	require.Equal(t, 1, r)
	_, err = p.Rank("nope")
	require.ErrorIs(t, err, priority.ErrUnknownTier)

	require.Equal(t, []string{"regulatory", "close", "adhoc"}, p.Order([]string{"adhoc", "regulatory", "close"}))
	require.Equal(t, []string{"trial-balance", "vat-return"}, p.Names())
	tier, ok := p.Assigned("trial-balance")
	require.True(t, ok)
	require.Equal(t, "close", tier)
}

// Reordering tiers reorders the queues: the order is the policy's, not the
// caller's.
func TestOrderComesFromThePolicy(t *testing.T) {
	t.Parallel()
	p := mustNew(t, priority.Config{Tiers: []string{"adhoc", "regulatory"}, Default: "adhoc"})
	require.Equal(t, []string{"adhoc", "regulatory"}, p.Order([]string{"regulatory", "adhoc"}))
	require.Equal(t, []string{"adhoc", "other"}, p.Order([]string{"other", "adhoc"}), "unknown tiers sort last")
}

// The policy copies what it is given: changing the caller's slices later
// changes nothing.
func TestPolicyIsImmutable(t *testing.T) {
	t.Parallel()
	tiers := []string{"a", "b"}
	assign := map[string]string{"x": "a"}
	p := mustNew(t, priority.Config{Tiers: tiers, Default: "b", Assign: assign})
	tiers[0] = "z"
	assign["x"] = "b"
	require.Equal(t, []string{"a", "b"}, p.Tiers())
	got, _ := p.Assigned("x")
	require.Equal(t, "a", got)
}

func TestInvalidPolicies(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  priority.Config
		want []string
	}{
		{"empty tier list", priority.Config{Default: "a"}, []string{
			"tiers: the list must name at least one tier",
			`default: tier "a" is not in tiers []`,
		}},
		{"duplicate tier", priority.Config{Tiers: []string{"a", "b", "a"}, Default: "a"}, []string{`tiers: tier "a" is listed twice`}},
		{"bad tier name", priority.Config{Tiers: []string{"Close Books"}, Default: "Close Books"}, []string{`tiers: tier "Close Books": a name must match`}},
		{"missing default", priority.Config{Tiers: []string{"a"}}, []string{"default: a default tier is required"}},
		{"unknown default", priority.Config{Tiers: []string{"a"}, Default: "b"}, []string{`default: tier "b" is not in tiers ["a"]`}},
		{"assigned an unknown tier", priority.Config{Tiers: []string{"a"}, Default: "a", Assign: map[string]string{"vat": "z"}}, []string{`"vat": tier "z" is not in tiers ["a"]`}},
		{"empty name", priority.Config{Tiers: []string{"a"}, Default: "a", Assign: map[string]string{"": "a"}}, []string{"an empty name is assigned a tier"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := priority.New(tc.cfg)
			require.Nil(t, p)
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestInversions(t *testing.T) {
	t.Parallel()
	p := mustNew(t, priority.Config{Tiers: []string{"regulatory", "close", "adhoc"}, Default: "adhoc"})
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
