package rdb

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func init() {
	scriptCases = append(scriptCases, scriptCase{script: "archived", name: "newest first, n per queue", run: func(t *testing.T, b backend) {
		ctx := context.Background()
		close, adhoc := b.KS.Queue("batch", "close"), b.KS.Queue("batch", "adhoc")
		for i, id := range []string{"a", "b", "c"} {
			require.NoError(t, b.RC.ZAdd(ctx, archivedKey(close), redis.Z{Score: float64(1000 + i), Member: id}).Err())
		}
		got, err := NewestArchived(ctx, b.RC, []string{close, adhoc}, 2)
		require.NoError(t, err)
		require.Equal(t, [][]Archived{
			{{Queue: close, ID: "c", At: time.Unix(1002, 0)}, {Queue: close, ID: "b", At: time.Unix(1001, 0)}},
			nil,
		}, got)
		got, err = NewestArchived(ctx, b.RC, []string{close}, 0)
		require.NoError(t, err)
		require.Equal(t, [][]Archived{nil}, got)
	}})
}
