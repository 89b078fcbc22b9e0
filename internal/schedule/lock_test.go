package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
)

// A period's lock is held by one token at a time; only its holder releases
// it, and it lapses on its own.
func TestPeriodLock(t *testing.T) {
	t.Parallel()
	store := newStore(t, testredis.New(t))
	ctx := context.Background()
	ok, err := store.LockPeriod(ctx, "2026-10", "a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = store.LockPeriod(ctx, "2026-10", "b", time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "a second token waits")
	ok, err = store.LockPeriod(ctx, "2026-09", "b", time.Minute)
	require.NoError(t, err)
	require.True(t, ok, "another period has a lock of its own")

	require.NoError(t, store.UnlockPeriod(ctx, "2026-10", "b"))
	holder, err := store.PeriodLockHolder(ctx, "2026-10")
	require.NoError(t, err)
	require.Equal(t, "a", holder, "another token's unlock leaves the lock")
	require.NoError(t, store.UnlockPeriod(ctx, "2026-10", "a"))
	holder, err = store.PeriodLockHolder(ctx, "2026-10")
	require.NoError(t, err)
	require.Empty(t, holder)

	ok, err = store.LockPeriod(ctx, "2026-08", "c", 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, ok)
	require.Eventually(t, func() bool {
		ok, err := store.LockPeriod(ctx, "2026-08", "d", time.Minute)
		require.NoError(t, err)
		return ok
	}, 10*time.Second, 20*time.Millisecond, "the lock lapses after its ttl")
}
