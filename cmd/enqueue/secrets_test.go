package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/testredis"
)

// TestNoPasswordInAnyOutput feeds Redis and database URLs that do not
// parse, or that carry the password where a parser does not expect it, and
// checks that no output of the command contains the password, whatever
// else goes wrong.
func TestNoPasswordInAnyOutput(t *testing.T) {
	t.Parallel()
	cfg := apptest.Config(t, testredis.New(t), "")
	report := []string{"report", "-name", "vat-return", "-period", "2026-10"}
	cases := []struct {
		name, env, value string
		code             int
		args             []string // default: status
	}{
		{"redis: bad escape in the password", "REDIS_URL", "redis://:s3cr%zzLEAK@127.0.0.1:6379/5", cli.ExitUsage, nil},
		{"redis: space in the password", "REDIS_URL", "redis://:pass LEAK@127.0.0.1:6379/5", cli.ExitUsage, nil},
		{"redis: non-numeric port", "REDIS_URL", "redis://:LEAKpw@127.0.0.1:port/5", cli.ExitUsage, nil},
		{"redis: missing ]", "REDIS_URL", "redis://:LEAKpw@[::1:6379/5", cli.ExitUsage, nil},
		{"redis: @ in the password", "REDIS_URL", "redis://:LEAK@pw@127.0.0.1:1/5", cli.ExitFailure, nil},
		{"redis: password query option", "REDIS_URL", "redis://127.0.0.1:1/5?password=LEAKqp", cli.ExitUsage, nil},
		{"redis: user and password, unreachable", "REDIS_URL", "redis://app:LEAKup@127.0.0.1:1/5", cli.ExitFailure, nil},
		// status only reads, so a bad database URL is a warning there;
		// report refuses it.
		{"database: bad escape", "DATABASE_URL", "postgres://postgres:s3c%zzLEAK@127.0.0.1:5432/x", cli.ExitOK, nil},
		{"database: key=value", "DATABASE_URL", "host=127.0.0.1 user=postgres password=LEAKkv dbname=x", cli.ExitOK, nil},
		{"database: quoted key=value", "DATABASE_URL", "host=127.0.0.1 password='LEAK kv' dbname=x", cli.ExitOK, nil},
		{"database: bad escape, report", "DATABASE_URL", "postgres://postgres:s3c%zzLEAK@127.0.0.1:5432/x", cli.ExitUsage, report},
		{"database: key=value, report", "DATABASE_URL", "host=127.0.0.1 user=postgres password=LEAKkv dbname=x", cli.ExitUsage, report},
		{"database: quoted key=value, report", "DATABASE_URL", "host=127.0.0.1 password='LEAK kv' dbname=x", cli.ExitUsage, report},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{tc.env: tc.value}
			args := tc.args
			if args == nil {
				args = []string{"status"}
			}
			var out, errOut bytes.Buffer
			code := run(context.Background(), cli.Env{
				Args: append([]string{"-config", cfg}, args...), Stdout: &out, Stderr: &errOut,
				Getenv: func(k string) string { return env[k] },
			})
			all := out.String() + errOut.String()
			require.Equal(t, tc.code, code, all)
			require.NotEmpty(t, all, "the command says what went wrong")
			require.NotContains(t, all, "LEAK", "a password shows in the output")
		})
	}
}

// TestSentinelAndClusterSecretsNeverShow: Redis passwords given for
// Sentinel or Cluster never show, whether the servers do not answer
// (exit 1) or the topology is refused (exit 2).
func TestSentinelAndClusterSecretsNeverShow(t *testing.T) {
	t.Parallel()
	cfg := apptest.Config(t, testredis.New(t), "")
	cases := []struct {
		name string
		env  map[string]string
		code int
		want string
	}{
		{"sentinels unreachable", map[string]string{
			"REDIS_SENTINEL_MASTER": "mymaster", "REDIS_SENTINEL_ADDRS": "127.0.0.1:1",
			"REDIS_PASSWORD": "LEAKdata", "REDIS_SENTINEL_PASSWORD": "LEAKsent",
		}, cli.ExitFailure, `redis at sentinel master "mymaster" via 127.0.0.1:1 is unreachable`},
		{"cluster unreachable", map[string]string{"REDIS_CLUSTER_ADDRS": "127.0.0.1:1", "REDIS_PASSWORD": "LEAKcluster"},
			cli.ExitFailure, "redis at cluster 127.0.0.1:1 is unreachable"},
		{"two topologies", map[string]string{"REDIS_CLUSTER_ADDRS": "127.0.0.1:1", "REDIS_URL": "redis://:LEAKurl@127.0.0.1:1/2"},
			cli.ExitUsage, "environment: set only one of REDIS_URL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			code := run(context.Background(), cli.Env{
				Args: []string{"-config", cfg, "status"}, Stdout: &out, Stderr: &errOut,
				Getenv: func(k string) string { return tc.env[k] },
			})
			all := out.String() + errOut.String()
			require.Equal(t, tc.code, code, all)
			require.Contains(t, all, tc.want)
			require.NotContains(t, all, "LEAK", "a password shows in the output")
		})
	}
}
