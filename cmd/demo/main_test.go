package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/cli"
)

func TestUsage(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-bogus"}, 2, "demo: flag provided but not defined: -bogus (run with -h for help)"},
		{[]string{"-orders-per-sec", "0"}, 2, "demo: -orders-per-sec and -searches-per-sec must be >= 1 and -warmup > 0"},
		{[]string{"stray"}, 2, `demo: unexpected argument "stray"`},
		{[]string{"-config", "/nonexistent.yaml"}, 2, "demo: config /nonexistent.yaml: 1 problem"},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), cli.Env{Args: tc.args, Stdout: &out, Stderr: &errOut, Getenv: noEnv})
		require.Equal(t, tc.code, code, tc.args)
		require.Contains(t, errOut.String(), tc.want)
	}
	var out bytes.Buffer
	require.Equal(t, 0, run(context.Background(), cli.Env{Args: []string{"-h"}, Stdout: &out, Stderr: &out, Getenv: noEnv}))
	require.Contains(t, out.String(), "usage: demo [flags]")
}
