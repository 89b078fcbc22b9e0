package database_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/database"
)

// TestPasswordsNeverShow feeds database URLs and connection strings, well
// formed or not, to everything that quotes one: Redact, Describe, Problems
// and Open's errors. None may show any part of a password (every password
// here contains LEAK), and Problems must still say what is wrong.
func TestPasswordsNeverShow(t *testing.T) {
	cases := []struct {
		name        string
		url         string
		redacted    string // what Redact returns
		problem     string // part of the URL's problem; "" for none
		leakToo     string // another part of the password to look for
		openProblem bool   // Open refuses the URL before connecting
	}{
		{
			name:     "valid",
			url:      "postgres://app:LEAKpw@127.0.0.1:1/x?connect_timeout=5",
			redacted: "postgres://app:xxxxx@127.0.0.1:1/x?connect_timeout=5",
		},
		{
			name:        "bad percent-escape in password",
			url:         "postgres://postgres:s3c%zzLEAK@127.0.0.1:1/x",
			redacted:    "postgres://postgres:xxxxx@127.0.0.1:1/x",
			problem:     `is not a valid URL: it has a "%" that is not followed by two hex digits; write "%" as %25`,
			leakToo:     "s3c%zz",
			openProblem: true,
		},
		{
			name:        "space in password",
			url:         "postgres://postgres:LEAK one@127.0.0.1:1/x",
			redacted:    "postgres://postgres:xxxxx@127.0.0.1:1/x",
			problem:     "is not a valid URL: its user name or password has a character that must be percent-encoded (a space is %20)",
			leakToo:     " one",
			openProblem: true,
		},
		{
			name:        "non-numeric port",
			url:         "postgres://u:LEAKport@127.0.0.1:54x2/x",
			redacted:    "postgres://u:xxxxx@127.0.0.1:54x2/x",
			problem:     "is not a valid URL: its port is not a number",
			openProblem: true,
		},
		{
			name:        "missing ] in IPv6 host",
			url:         "postgres://u:LEAKv6@[::1:5432/x",
			redacted:    "postgres://u:xxxxx@[::1:5432/x",
			problem:     `is not a valid URL: its IPv6 host lacks the closing "]"`,
			openProblem: true,
		},
		{
			name:        "newline in password",
			url:         "postgres://u:LEAK\nnl@127.0.0.1:1/x",
			redacted:    "postgres://u:xxxxx@127.0.0.1:1/x",
			problem:     "is not a valid URL: it has a control character",
			leakToo:     "nl@",
			openProblem: true,
		},
		{
			name:        "password typed as the port, no @",
			url:         "postgres://u:LEAKnoat/x",
			redacted:    "postgres://u:xxxxx/x",
			problem:     "its port is not a number",
			openProblem: true,
		},
		{
			name:        "slash in password",
			url:         "postgres://u:12/LEAK@127.0.0.1:1/x",
			redacted:    "postgres://u:xxxxx@127.0.0.1:1/x",
			problem:     `is ambiguous: it has an "@" after the host; write "/" in a password as %2F`,
			leakToo:     "12/",
			openProblem: true,
		},
		{
			name:        "@ in password",
			url:         "postgres://u:LEAK@LEAK@127.0.0.1:1/x",
			redacted:    "postgres://u:xxxxx@127.0.0.1:1/x",
			problem:     `is ambiguous: it has more than one "@" before the host; write an "@" in the user name or password as %40`,
			openProblem: true,
		},
		{
			name:        "? in password",
			url:         "postgres://u:12?LEAK@127.0.0.1:1/x",
			redacted:    "postgres://u:xxxxx@127.0.0.1:1/x",
			problem:     `is ambiguous: its user name or password has a "?" or "#"; write them as %3F and %23`,
			leakToo:     "12?",
			openProblem: true,
		},
		{
			name:     "password query option",
			url:      "postgres://u@127.0.0.1:1/x?sslmode=disable&password=LEAKq&application_name=LEAKperhaps",
			redacted: "postgres://u@127.0.0.1:1/x?sslmode=disable&password=xxxxx",
		},
		{
			name:     "sslpassword query option, percent-encoded key",
			url:      "postgres://u@127.0.0.1:1/x?ss%6Cpassword=LEAKssl&sslmode=disable",
			redacted: "postgres://u@127.0.0.1:1/x?ss%6Cpassword=xxxxx",
		},
		{
			name:        "& in a password query option",
			url:         "postgres://u@127.0.0.1:1/x?password=LEAK&LEAKtoo",
			redacted:    "postgres://u@127.0.0.1:1/x?password=xxxxx",
			problem:     `is ambiguous: its query has a part that is not one key=value`,
			openProblem: true,
		},
		{
			name:        "# in a password query option",
			url:         "postgres://u@127.0.0.1:1/x?password=LEAK#LEAKtoo&sslmode=disable",
			redacted:    "postgres://u@127.0.0.1:1/x?password=xxxxx",
			problem:     `is ambiguous: it has a "#"; write it as %23`,
			openProblem: true,
		},
		{
			name:        "password query option in a URL that does not parse",
			url:         "postgres://u:a%zz@127.0.0.1:1/x?password=LEAKq&application_name=w",
			redacted:    "postgres://u:xxxxx@127.0.0.1:1/x?password=xxxxx",
			problem:     `it has a "%" that is not followed by two hex digits`,
			openProblem: true,
		},
		{
			name:     "pgx rejects what url.Parse accepts",
			url:      "postgres://u:LEAKpgx@127.0.0.1:1/x?sslmode=bogus&password=LEAK2",
			redacted: "postgres://u:xxxxx@127.0.0.1:1/x?sslmode=bogus&password=xxxxx",
		},
		{
			name:        "key=value, unquoted",
			url:         "host=127.0.0.1 port=1 password=LEAKkv dbname=x",
			redacted:    "host=127.0.0.1 port=1 password=xxxxx",
			problem:     "must be a postgres:// URL, not a key=value connection string",
			openProblem: true,
		},
		{
			name:        "key=value, quoted",
			url:         `host=127.0.0.1 password = 'LEAK q\'uoted' sslpassword=LEAK\ esc dbname=x`,
			redacted:    `host=127.0.0.1 password = 'xxxxx' sslpassword=xxxxx`,
			problem:     "not a key=value connection string",
			leakToo:     "uoted",
			openProblem: true,
		},
		{
			name:        "key=value, space in an unquoted password",
			url:         "host=127.0.0.1 password=LEAK one dbname=x",
			redacted:    "host=127.0.0.1 password=xxxxx",
			problem:     "not a key=value connection string",
			leakToo:     "one",
			openProblem: true,
		},
		{
			name:        "key=value, unterminated quote",
			url:         "host=127.0.0.1 password='LEAK one dbname=x",
			redacted:    "host=127.0.0.1 password=xxxxx",
			problem:     "not a key=value connection string",
			leakToo:     "one",
			openProblem: true,
		},
		{
			name:        "key=value with :// in the password",
			url:         "password=a://LEAK@h",
			redacted:    "password=xxxxx",
			problem:     "not a key=value connection string",
			openProblem: true,
		},
		{
			name:        "no :// at all",
			url:         "postgres:u:LEAK@h",
			redacted:    "(not a URL; not shown in case it holds a password)",
			problem:     "must be a postgres:// URL",
			openProblem: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			noLeak := func(what, s string) {
				t.Helper()
				for _, secret := range []string{"LEAK", tc.leakToo} {
					if secret != "" {
						require.NotContainsf(t, s, secret, "%s shows the password", what)
					}
				}
			}
			require.Equal(t, tc.redacted, database.Redact(tc.url))

			cfg := database.Config{URL: tc.url}
			cfg.SetDefaults()
			noLeak("Describe", cfg.Describe())
			require.Equal(t, "PostgreSQL "+tc.redacted, cfg.Describe())
			problems := cfg.Problems()
			for _, p := range problems {
				noLeak("Problems", p)
			}
			if tc.problem == "" {
				require.Empty(t, problems)
			} else {
				require.Len(t, problems, 1)
				require.Contains(t, problems[0], `database: url "`)
				require.Contains(t, problems[0], tc.problem)
			}

			_, err := database.Open(context.Background(), cfg, nil)
			require.Error(t, err)
			noLeak("Open", err.Error())
			if tc.openProblem {
				require.Equal(t, problems[0], err.Error(), "Open refuses what Problems names, before connecting")
			} else {
				require.True(t, strings.HasPrefix(err.Error(), "database: "), err.Error())
			}
		})
	}
}
