package cli_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/cli"
)

// Durations in logs read as durations, in text and in JSON.
func TestLogDurationsAsText(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		log, err := cli.NewLogger(&buf, format, "info")
		require.NoError(t, err)
		log.Info("pool started", "poll_interval", 100*time.Millisecond)
		require.Contains(t, buf.String(), "100ms", format)
		require.NotContains(t, buf.String(), "100000000", format)
	}
}
