package web_test

import (
	"context"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
)

// The page's dependencies and adaptive limit, without a browser (the
// browser test checks them against /api/status during a month-end): each
// dependency's capacity, claims and use per pool, OVERBOOKED when the
// claims exceed the capacity (allow_overbooking), and the adaptive pool's
// limit, bounds and timeline, where an operator's resize shows as "size N"
// and its reset as "reset", newest first.
func TestDashboardShowsDependenciesAndAdaptiveLimit(t *testing.T) {
	s := newStackWith(t, func(path string) {
		apptest.ReplaceInConfig(t, path, "database:\n", "dependencies: [{name: reports-db, capacity: 8}]\ndatabase:\n  allow_overbooking: true\n")
		apptest.ReplaceInConfig(t, path, "[order:create]\n", "[order:create]\n    uses: {reports-db: 1}\n")
		apptest.ReplaceInConfig(t, path, "[search:index]\n", "[search:index]\n    uses: {reports-db: 2}\n")
		apptest.ReplaceInConfig(t, path, "    max_retry: 2\n", "    max_retry: 2\n    max_size: 4\n    uses: {reports-db: 1}\n    adaptive: {min: 1}\n")
	}, func(cfg *app.Config) { cfg.HTTP.Listen = "127.0.0.1:0" })

	page := s.page()
	has := func(key, value string) {
		t.Helper()
		require.Regexp(t, regexp.MustCompile(`data-k="`+regexp.QuoteMeta(key)+`"[^>]*>`+regexp.QuoteMeta(value)+`<`), page, key)
	}
	has("dep/reports-db/capacity", "8")
	has("dep/reports-db/claimed", "11") // 3×1 + 2×2 + max_size 4×1
	has("dep/reports-db/in-use", "0")
	has("dep/reports-db/search/units", "2")
	has("dep/reports-db/search/claimed", "4")
	has("dep/reports-db/batch/claimed", "4")
	require.Contains(t, page, `<div class="dependency overbooked" id="dep-reports-db">`)
	require.Contains(t, page, "OVERBOOKED")
	has("batch/adaptive/limit", "2")
	has("batch/adaptive/min", "1")
	has("batch/adaptive/max", "4")
	has("batch/adaptive/changes", "0")
	require.Contains(t, page, "no change yet: the limit starts at the configured size")
	require.NotContains(t, page, `data-k="order/adaptive/limit"`, "order is not adaptive")
	require.NotContains(t, page, `class="changes"`, "no change to list yet")
	require.NotContains(t, page, `batch/adaptive/held`)

	require.NoError(t, s.enq.Client.Resize(context.Background(), "batch", 3))
	page = s.page()
	has("batch/adaptive/held", "held off: an operator's size 3 is in effect")
	require.Contains(t, page, `<td class="move">size 3</td><td class="creason">an operator resized the pool (the adaptive limit waits for a reset)</td>`)

	require.NoError(t, s.enq.Client.ResetSize(context.Background(), "batch"))
	page = s.page()
	require.NotContains(t, page, `batch/adaptive/held`)
	require.Regexp(t, `(?s)<tr class="change operator">.*<td class="move">reset</td><td class="creason">an operator reset the size: the adaptive limit holds again</td>.*`+
		`<td class="move">size 3</td>`, page, "newest first")
}
