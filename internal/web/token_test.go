package web_test

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/internal/web"
)

// A rotated token takes effect without a restart: at once on a reload,
// within a few seconds on its own (the listener rereads the file); the old
// token is refused from then on. A reload that drops http.token_file makes
// the dashboard read-only.
func TestTokenRotation(t *testing.T) {
	t.Parallel()
	tokenFile := filepath.Join(t.TempDir(), "dashboard.token")
	writeToken := func(token string) {
		t.Helper()
		// As a Kubernetes Secret does it: a new file put in place at once.
		tmp := tokenFile + ".new"
		require.NoError(t, os.WriteFile(tmp, []byte(token+"\n"), 0o600))
		require.NoError(t, os.Rename(tmp, tokenFile))
	}
	const first, second, third = "first-token-0123456789", "second-token-0123456789", "third-token-0123456789"
	writeToken(first)
	tokenLine := "  token_file: " + tokenFile + "\n"
	s := newStackWith(t, func(path string) {
		apptest.ReplaceInConfig(t, path, "    max_retry: 2\n", "    max_retry: 2\nhttp:\n  listen: 127.0.0.1:0\n"+tokenLine)
	}, nil)
	resume := func(token string) int {
		t.Helper()
		code, body := s.post("/actions/resume", url.Values{"pool": {"batch"}}, token)
		require.Contains(t, []int{http.StatusOK, http.StatusUnauthorized, http.StatusForbidden}, code, body)
		return code
	}
	reload := func() {
		t.Helper()
		next, err := app.Load(s.cfg.Path, nil)
		require.NoError(t, err)
		_, err = s.worker.Reload(context.Background(), next)
		require.NoError(t, err)
	}
	require.Equal(t, http.StatusOK, resume(first))

	t.Run("on reload", func(t *testing.T) {
		writeToken(second)
		reload()
		require.Equal(t, http.StatusOK, resume(second), "the new token works at once")
		require.Equal(t, http.StatusUnauthorized, resume(first), "the old one is refused")
	})

	t.Run("on disk, without a reload", func(t *testing.T) {
		writeToken(third)
		took := testwait.For(t, 3*web.TokenPollInterval+10*time.Second, "the new token to work", func() bool {
			return resume(third) == http.StatusOK
		})
		t.Logf("the new token worked after %s", took)
		require.Equal(t, http.StatusUnauthorized, resume(second), "the old one is refused")
	})

	t.Run("reload without a token file: read-only", func(t *testing.T) {
		apptest.ReplaceInConfig(t, s.cfg.Path, tokenLine, "")
		reload()
		require.Equal(t, http.StatusForbidden, resume(third))
		_, page := s.get("/")
		require.Contains(t, page, "read-only: no http.token_file in the worker config")
	})
}
