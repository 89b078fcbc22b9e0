package web_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/web"
)

// The start-up log says the address really bound and a URL that works
// from this machine; an address beyond loopback gets a WARN (with a
// token) or an ERROR (without one) saying what it exposes.
func TestAnnounce(t *testing.T) {
	t.Parallel()
	s := newStack(t, "")
	const info = `level=INFO msg="http: serving metrics, probes and the dashboard" listen=%s url=http://127.0.0.1:%d/ actions=%t`
	const exposed = "anyone who can reach it can read the dashboard, /api/status and /metrics (pool and queue names, job IDs, failure messages); "
	cases := []struct {
		name  string
		addr  string
		token bool
		every bool   // bound on every interface (else 127.0.0.1)
		extra string // the warning line, %s the bound address
	}{
		{"loopback", "127.0.0.1:0", false, false, ""},
		// Go binds 0.0.0.0 as [::], IPv4 and IPv6, where IPv6 exists.
		{"every interface (0.0.0.0), with a token", "0.0.0.0:0", true, true,
			`level=WARN msg="http: listening beyond this machine: ` + exposed + `the actions need the token, which travels in clear text (no TLS): bind 127.0.0.1 unless that is what you want" listen=%s`},
		{"every interface (no host), no token", ":0", false, true,
			`level=ERROR msg="http: listening beyond this machine, with no http.token_file: ` + exposed + `the actions are refused (read-only): bind 127.0.0.1 unless that is what you want" listen=%s`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv, err := web.New(web.Options{Addr: tc.addr, Enqueuer: s.enq})
			require.NoError(t, err)
			require.NoError(t, srv.Start(context.Background()))
			t.Cleanup(func() { require.NoError(t, srv.Stop(context.Background())) })
			l := srv.Listening()
			bound, err := net.ResolveTCPAddr("tcp", l.Addr)
			require.NoError(t, err)
			p := bound.Port
			require.Equal(t, net.JoinHostPort(bound.IP.String(), fmt.Sprint(p)), l.Addr)
			if tc.every {
				require.True(t, bound.IP.IsUnspecified(), "listen=%s is the address really bound: every interface", l.Addr)
			} else {
				require.Equal(t, "127.0.0.1", bound.IP.String())
			}
			require.Equal(t, fmt.Sprintf("http://127.0.0.1:%d/", p), srv.URL())

			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			}}))
			web.Announce(log, l, tc.token)
			want := fmt.Sprintf(info, l.Addr, p, tc.token) + "\n"
			if tc.extra != "" {
				want += fmt.Sprintf(tc.extra, l.Addr) + "\n"
			}
			require.Equal(t, want, buf.String())

			// The URL logged answers.
			code, _ := getURL(t, l.URL+"healthz")
			require.Equal(t, 200, code)
		})
	}
}

func getURL(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}
