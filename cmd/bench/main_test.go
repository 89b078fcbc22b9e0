package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/cli"
)

func TestFlags(t *testing.T) {
	noEnv := func(string) string { return "" }
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"DB 0 refused", []string{"-redis-url", "redis://127.0.0.1:6379/0"}, 2, "bench: refusing Redis DB 0"},
		{"DB 0 by default port form", []string{"-redis-url", "redis://127.0.0.1:6379"}, 2, "bench: refusing Redis DB 0"},
		{"unknown section", []string{"-sections", "isolation,speed"}, 2, `bench: unknown section "speed"`},
		{"bad scale", []string{"-scale", "0"}, 2, "bench: -scale must be > 0"},
		{"unreachable", []string{"-redis-url", "redis://127.0.0.1:1/3"}, 1, "bench: redis at 127.0.0.1:1 is unreachable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), cli.Env{Args: tc.args, Stdout: &out, Stderr: &errOut, Getenv: noEnv})
			require.Equal(t, tc.code, code)
			require.Contains(t, errOut.String(), tc.want)
		})
	}
}
