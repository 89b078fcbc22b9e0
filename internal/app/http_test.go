package app_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/testredis"
)

// The http section: the token is read from its file, relative to the
// config, trimmed; every problem is reported with the others and never
// quotes the token.
func TestHTTPSection(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "good.token"), []byte("  0123456789abcdefXYZ\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "two-words.token"), []byte("0123456789 abcdefXYZ-SECRET\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "empty.token"), []byte("\n"), 0o600))

	load := func(extra string) (*app.Config, error) {
		path := testConfig(t, r, extra)
		// The token file is named relative to the config file.
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		moved := filepath.Join(dir, filepath.Base(path))
		require.NoError(t, os.WriteFile(moved, data, 0o600))
		return app.Load(moved, nil)
	}

	cfg, err := load("http:\n  listen: 127.0.0.1:0\n  token_file: good.token\n")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:0", cfg.HTTP.Listen)
	require.Equal(t, "0123456789abcdefXYZ", cfg.HTTP.Token)

	cfg, err = load("")
	require.NoError(t, err)
	require.Empty(t, cfg.HTTP.Listen, "no listener unless configured")

	for _, tc := range []struct{ extra, want string }{
		{"http:\n  listen: \":http\"\n", `http.listen: ":http": port must be a number from 0 to 65535`},
		{"http:\n  token_file: two-words.token\n", "must be one word of at least 16 characters"},
		{"http:\n  token_file: empty.token\n", "empty.token is empty"},
		{"http:\n  token_file: nope.token\n", fmt.Sprintf("http.token_file: %s does not exist", filepath.Join(dir, "nope.token"))},
		{"http:\n  token_file: /dev/zero\n", "http.token_file: /dev/zero is longer than 4096 bytes: is it the right file?"},
	} {
		_, err := load(tc.extra)
		require.ErrorContains(t, err, tc.want)
		require.NotContains(t, err.Error(), "SECRET")
	}
}
