package bulkhead_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/bulkhead"
)

func TestRegistry(t *testing.T) {
	r := bulkhead.NewRegistry()
	for _, c := range []bulkhead.Config{
		{Name: "order", MaxConcurrent: 8},
		{Name: "search", MaxConcurrent: 8},
		{Name: "batch", MaxConcurrent: 4},
	} {
		_, err := r.Register(c)
		require.NoError(t, err)
	}

	b, err := r.Get("batch")
	require.NoError(t, err)
	require.Equal(t, 4, b.MaxConcurrent())

	_, err = r.Register(bulkhead.Config{Name: "batch", MaxConcurrent: 2})
	require.ErrorIs(t, err, bulkhead.ErrDuplicate)
	require.EqualError(t, err, `bulkhead: duplicate name: "batch" is already registered`)
	b, _ = r.Get("batch")
	require.Equal(t, 4, b.MaxConcurrent(), "a failed Register changes nothing")

	_, err = r.Get("reports")
	require.ErrorIs(t, err, bulkhead.ErrNotFound)
	require.EqualError(t, err, `bulkhead: not found: "reports" (registered: ["order" "search" "batch"])`)

	_, err = r.Register(bulkhead.Config{Name: "bad"})
	require.EqualError(t, err, `bulkhead "bad": MaxConcurrent must be >= 1, got 0`)
	_, err = r.Get("bad")
	require.ErrorIs(t, err, bulkhead.ErrNotFound, "an invalid config is not registered")

	var names []string
	for _, b := range r.All() {
		names = append(names, b.Name())
	}
	require.Equal(t, []string{"order", "search", "batch"}, names, "registration order")

	stats := r.Stats()
	require.Len(t, stats, 3)
	require.Equal(t, "search", stats[1].Name)
	require.Equal(t, 8, stats[1].Available)
}

func TestRegistryConcurrent(t *testing.T) {
	r := bulkhead.NewRegistry()
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		// Two goroutines race to register each name; exactly one wins.
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := r.Register(bulkhead.Config{Name: fmt.Sprintf("pool-%d", i), MaxConcurrent: 1})
				errs <- err
				_ = r.All()
			}()
		}
	}
	wg.Wait()
	close(errs)
	var ok, dup int
	for err := range errs {
		if err == nil {
			ok++
		} else {
			require.ErrorIs(t, err, bulkhead.ErrDuplicate)
			dup++
		}
	}
	require.Equal(t, n, ok)
	require.Equal(t, n, dup)
	require.Len(t, r.All(), n)
	for i := range n {
		_, err := r.Get(fmt.Sprintf("pool-%d", i))
		require.NoError(t, err)
	}
}
