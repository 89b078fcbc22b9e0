package database

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestScrub: should a driver ever quote a connection string with its
// password, Open's errors still do not show it, and still match what they
// wrap.
func TestScrub(t *testing.T) {
	cases := []struct{ name, url, text, want string }{
		{"userinfo, as written and decoded", "postgres://u:LEAK%2Fpw@h/x",
			"dial postgres://u:LEAK%2Fpw@h/x and LEAK/pw", "dial postgres://u:xxxxx@h/x and xxxxx"},
		{"query option", "postgres://u@h/x?password=LEAK%20q",
			"password=LEAK%20q or LEAK q", "password=xxxxx or xxxxx"},
		{"key=value, quoted", "host=h password='LEAK q' dbname=x",
			"cannot parse host=h password='LEAK q'", "cannot parse host=h password='xxxxx'"},
		{"key=value, unquoted", "host=h password=LEAKkv",
			"password=LEAKkv", "password=xxxxx"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			inner := errors.New(tc.text)
			err := scrub(errors.Join(context.Canceled, inner), tc.url)
			require.NotContains(t, err.Error(), "LEAK")
			require.Equal(t, "context canceled\n"+tc.want, err.Error())
			require.ErrorIs(t, err, context.Canceled)
			require.ErrorIs(t, err, inner)
		})
	}
	clean := errors.New("nothing secret")
	require.Same(t, clean, scrub(clean, "postgres://u:LEAK@h/x"), "an error without the password is returned as it is")
	require.NoError(t, scrub(nil, "postgres://u:LEAK@h/x"))
}
