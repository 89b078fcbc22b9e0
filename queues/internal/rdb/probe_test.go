package rdb

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func init() {
	scriptCases = append(scriptCases, scriptCase{script: "probe", name: "a queue's node answers", run: func(t *testing.T, b backend) {
		ctx := context.Background()
		require.NoError(t, QueueAnswers(ctx, b.RC, b.KS.Queue("batch", "close")))
		require.NoError(t, QueueAnswers(ctx, b.RC, ""))
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		require.Error(t, QueueAnswers(cancelled, b.RC, b.KS.Queue("batch", "close")), "a read that cannot happen is an error")
	}})
}
