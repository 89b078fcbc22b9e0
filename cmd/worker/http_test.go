package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
)

// Bad HTTP settings stop the start with a message that names them: a
// malformed address or a missing token file is a config problem (exit 2),
// a port in use a runtime failure (exit 1). The token never shows.
func TestHTTPBadInput(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()

	dir := t.TempDir()
	short := filepath.Join(dir, "short-token")
	require.NoError(t, os.WriteFile(short, []byte("tooshort-SECRET\n"), 0o600))
	missing := filepath.Join(dir, "no-such-token")

	cases := []struct {
		name  string
		extra string
		args  []string
		code  int
		want  string
	}{
		{"malformed listen", "http:\n  listen: localhost\n", nil, 2, `http.listen: "localhost" is not host:port`},
		{"bad port", "http:\n  listen: 127.0.0.1:99999\n", nil, 2, `http.listen: "127.0.0.1:99999": port must be a number from 0 to 65535`},
		{"malformed flag", "", []string{"-http", "8080"}, 2, `worker: -http: "8080" is not host:port`},
		{"missing token file", fmt.Sprintf("http:\n  listen: 127.0.0.1:0\n  token_file: %s\n", missing), nil, 2,
			"http.token_file: " + missing + " does not exist"},
		{"short token", fmt.Sprintf("http:\n  listen: 127.0.0.1:0\n  token_file: %s\n", short), nil, 2,
			"must be one word of at least 16 characters"},
		{"unknown key", "http:\n  listen: 127.0.0.1:0\n  tokn_file: x\n", nil, 2, "tokn_file"},
		{"port in use", "", []string{"-http", busy.Addr().String()}, 1, "worker: http: listen on " + busy.Addr().String() + ": "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := apptest.Config(t, r, tc.extra)
			apptest.ReplaceInConfig(t, path, "seed_orders: 3000", "seed_orders: 100") // seeding is most of a start under -race
			code, stderr := runWorkerWithin(t, 30*time.Second, append([]string{"-config", path}, tc.args...)...)
			require.Equal(t, tc.code, code, stderr)
			require.Contains(t, stderr, tc.want)
			require.NotContains(t, stderr, "SECRET", "the token is never printed")
		})
	}
}

// With -http the worker serves its probes and metrics while it runs, takes
// a rotated token on SIGHUP, and closes the listener when it stops.
func TestWorkerServesHTTP(t *testing.T) {
	r := testredis.New(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("0123456789abcdef-SECRET\n"), 0o600))
	path := apptest.Config(t, r, fmt.Sprintf("http:\n  token_file: %s\n", tokenFile))
	apptest.ReplaceInConfig(t, path, "seed_orders: 3000", "seed_orders: 100")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	hup := make(chan os.Signal, 1)
	w := startWorker(t, cli.Env{Args: []string{"-config", path, "-http", addr}, Reload: hup})
	errOut := w.log
	get := func(p string) (int, string) {
		resp, err := http.Get("http://" + addr + p)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("/readyz")
	require.Equal(t, http.StatusOK, code, body)
	code, body = get("/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `compartment_pool_size{pool="batch"} 2`)
	require.Contains(t, errOut.String(), `msg="http: serving metrics, probes and the dashboard" listen=`+addr+" url=http://"+addr+"/ actions=true")
	require.NotContains(t, errOut.String(), "beyond this machine", "loopback is not exposed")

	// The token file is rotated (a Secret does it on its own): SIGHUP
	// puts the new token in effect; the old one is refused.
	resume := func(token string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/actions/resume", strings.NewReader("pool=batch"))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-Compartment-Token", token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, resume("0123456789abcdef-SECRET"))
	require.NoError(t, os.WriteFile(tokenFile, []byte("fedcba9876543210-SECRET\n"), 0o600))
	hup <- syscall.SIGHUP
	// The reload logs the new token just after "config in effect"; the
	// listener's own reread may have seen the file first.
	testwait.For(t, 30*time.Second, "the new token to be in effect, or the reload refused", func() bool {
		out := errOut.String()
		return strings.Contains(out, "reload: the http token changed: the new one is in effect, the old one is refused") ||
			strings.Contains(out, "http: the token file holds a new token: it is in effect, the old one is refused") ||
			strings.Contains(out, "reload refused")
	})
	require.NotContains(t, errOut.String(), "reload refused")
	require.Equal(t, http.StatusOK, resume("fedcba9876543210-SECRET"))
	require.Equal(t, http.StatusUnauthorized, resume("0123456789abcdef-SECRET"))

	w.stop(t)
	_, err = http.Get("http://" + addr + "/healthz")
	require.Error(t, err, "the listener is closed with the worker")
	require.False(t, strings.Contains(errOut.String(), "SECRET"), "the token is never logged")
}
