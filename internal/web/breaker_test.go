package web_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/queues"
)

// The dashboard forces a pool's circuit breaker as `enqueue breaker` does,
// with the token like pause and resume; every refusal says why and
// changes nothing.
func TestBreakerAction(t *testing.T) {
	t.Parallel()
	withBreaker := func(path string) {
		// A test's own edit replaces the stack's default door and
		// breaker: this one gives the batch pool a breaker of its own.
		apptest.ReplaceInConfig(t, path, "    max_retry: 2\n", "    max_retry: 2\n    breaker: {min_calls: 5, window: 1m, cool_down: 30s}\n")
	}
	s := newStackWith(t, withBreaker, func(cfg *app.Config) { cfg.HTTP.Listen, cfg.HTTP.Token = "127.0.0.1:0", testToken })
	state := func() queues.BreakerState {
		t.Helper()
		st, err := s.enq.Client.Breaker(context.Background(), "batch")
		require.NoError(t, err)
		return st
	}
	untouched := func() {
		t.Helper()
		st := state()
		require.Equal(t, queues.BreakerClosed, st.State, "nothing changed")
		require.Empty(t, st.Forced, "nothing changed")
		require.Equal(t, []string{"", "", "", ""}, s.pausedKeys(), "nothing changed")
	}

	t.Run("refused", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			form  url.Values
			token string
			code  int
			body  string
		}{
			{"no token", url.Values{"pool": {"batch"}, "op": {"open"}}, "", http.StatusUnauthorized, "refused: missing or wrong token"},
			{"wrong token", url.Values{"pool": {"batch"}, "op": {"open"}}, "wrong-token-0123456789", http.StatusUnauthorized, "refused: missing or wrong token"},
			{"wrong token in the form", url.Values{"pool": {"batch"}, "op": {"open"}, "token": {"wrong-token-0123456789"}}, "", http.StatusUnauthorized, "refused: missing or wrong token"},
			{"bad op", url.Values{"pool": {"batch"}, "op": {"explode"}}, testToken, http.StatusBadRequest, `op must be open, close or reset, got "explode"`},
			{"no op", url.Values{"pool": {"batch"}}, testToken, http.StatusBadRequest, `op must be open, close or reset, got ""`},
			{"unknown pool", url.Values{"pool": {"nope"}, "op": {"open"}}, testToken, http.StatusNotFound, `unknown pool "nope" (pools: ["order" "search" "batch"])`},
			{"pool without a breaker", url.Values{"pool": {"order"}, "op": {"open"}}, testToken, http.StatusConflict,
				`pool "order" has no circuit breaker (breaker: in its config; pools with one: ["batch"])`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				code, body := s.post("/actions/breaker", tc.form, tc.token)
				require.Equal(t, tc.code, code, body)
				require.Equal(t, tc.body, body)
				untouched()
			})
		}
	})

	t.Run("read-only worker", func(t *testing.T) {
		ro := newStackWith(t, withBreaker, func(cfg *app.Config) { cfg.HTTP.Listen = "127.0.0.1:0" })
		code, body := ro.post("/actions/breaker", url.Values{"pool": {"batch"}, "op": {"open"}}, testToken)
		require.Equal(t, http.StatusForbidden, code)
		require.Equal(t, "refused: this worker is read-only (no http.token_file in its config)", body)
	})

	t.Run("open, close, reset", func(t *testing.T) {
		code, body := s.post("/actions/breaker", url.Values{"pool": {"batch"}, "op": {"open"}}, testToken)
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, `breaker of pool "batch" forced open: now open (forced open until reset)`, body)
		st := state()
		require.Equal(t, queues.BreakerOpen, st.State)
		require.Equal(t, queues.BreakerOpen, st.Forced)
		require.Contains(t, s.logs.String(), `msg="http: circuit breaker forced open from the dashboard" pool=batch op=open state=open remote=127.0.0.1:`)

		// The token as a form field works too.
		code, body = s.post("/actions/breaker", url.Values{"pool": {"batch"}, "op": {"close"}, "token": {testToken}}, "")
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, `breaker of pool "batch" forced closed: now closed (forced closed until reset)`, body)
		st = state()
		require.Equal(t, queues.BreakerClosed, st.State)
		require.Equal(t, queues.BreakerClosed, st.Forced)
		require.Contains(t, s.logs.String(), `msg="http: circuit breaker forced closed from the dashboard" pool=batch op=close state=closed`)

		code, body = s.post("/actions/breaker", url.Values{"pool": {"batch"}, "op": {"reset"}}, testToken)
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, `breaker of pool "batch" reset: now closed`, body)
		untouched()
		require.Contains(t, s.logs.String(), `msg="http: circuit breaker reset from the dashboard" pool=batch op=reset state=closed`)

		// The worker serving the dashboard made those changes: its
		// metrics count them (the reset of a breaker closed already is no
		// change).
		_, metricsText := s.get("/metrics")
		for _, want := range []string{
			`compartment_breaker_transitions_total{from="closed",pool="batch",to="open"} 1`,
			`compartment_breaker_transitions_total{from="open",pool="batch",to="closed"} 1`,
			`compartment_breaker_transitions_total{from="half-open",pool="batch",to="closed"} 0`,
		} {
			require.Contains(t, metricsText, want)
		}
	})
}
