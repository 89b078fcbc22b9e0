package handlers_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/database"
	"github.com/lci-labs/compartment/internal/quote"
	"github.com/lci-labs/compartment/queues"
)

// TestHugePayloadValuesAreCut: a 10 MB value injected into a queued job's
// payload is quoted in the decode error cut to a few dozen bytes with its
// length; the error, which asynq stores with the job and the worker logs,
// still says what is wrong. Before, the value was copied whole (one 10 MB
// log line and 25 MB in Redis per job).
func TestHugePayloadValuesAreCut(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat("Q", 10<<20)
	payload := func(v any) []byte {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		return b
	}
	cases := []struct {
		name   string
		decode func() error
		values int // how many huge values the message quotes
		want   []string
	}{
		{"report name", func() error {
			_, err := handlers.Report.Decode(payload(handlers.ReportPayload{Report: huge, Period: "2026-10"}))
			return err
		}, 1, []string{`job type "report:run": malformed payload: report name "QQQQ`, `... (10485760 bytes) is invalid: use letters`}},
		{"report period", func() error {
			_, err := handlers.Report.Decode(payload(handlers.ReportPayload{Report: "vat-return", Period: huge}))
			return err
		}, 1, []string{`job type "report:run": malformed payload: period "QQQQ`, `... (10485760 bytes) must be a month written YYYY-MM`}},
		{"order region and category", func() error {
			_, err := handlers.Order.Decode(payload(handlers.OrderPayload{Region: huge, Category: huge, CustomerID: 1, AmountCents: 1}))
			return err
		}, 2, []string{`region "QQQQ`, `... (10485760 bytes) is not one of [`, `category "QQQQ`}},
		{"search category", func() error {
			_, err := handlers.Search.Decode(payload(handlers.SearchPayload{ProductID: 1, Title: huge, Category: huge}))
			return err
		}, 1, []string{`job type "search:index": malformed payload: category "QQQQ`, `... (10485760 bytes) is not one of [`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.decode()
			require.Error(t, err)
			msg := err.Error()
			// Each value shows at most quote.Max bytes; the rest is the
			// fixed text, which says what a valid value looks like.
			require.LessOrEqual(t, strings.Count(msg, "Q"), tc.values*quote.Max, "%.600s", msg)
			require.Less(t, len(msg), tc.values*400, "%.600s", msg)
			for _, w := range tc.want {
				require.Contains(t, msg, w)
			}
			require.True(t, errors.Is(err, queues.ErrMalformedPayload) && errors.Is(err, asynq.SkipRetry), "a permanent malformed-payload failure: %.300s", msg)
		})
	}
}

// TestPayloadDocs: every job type has a payload description read from its
// Go type, whose example passes the strict decoder and the checks that
// enqueue job and the handler use, and whose fields are exactly the
// payload's JSON fields, each with its type and meaning.
func TestPayloadDocs(t *testing.T) {
	t.Parallel()
	var types []string
	for _, d := range handlers.Payloads() {
		types = append(types, d.JobType)
	}
	require.Equal(t, handlers.JobTypes(), types, "one description per job type, in order")

	for _, jt := range handlers.JobTypes() {
		t.Run(jt, func(t *testing.T) {
			d, err := handlers.PayloadOf(jt)
			require.NoError(t, err)
			require.NotEmpty(t, d.Summary)
			require.NoError(t, handlers.Check(jt, d.Example), "the example is a valid payload: %s", d.Example)
			require.NotContains(t, string(d.Example), "'", "enqueue job -example prints it inside single quotes")
			var asMap map[string]any
			require.NoError(t, json.Unmarshal(d.Example, &asMap))
			var names []string
			for _, f := range d.Fields {
				names = append(names, f.Name)
				require.NotEmpty(t, f.Meaning, "field %q of %s needs a doc tag", f.Name, jt)
				require.Contains(t, []string{"string", "integer"}, f.Type, "field %q", f.Name)
				require.Contains(t, asMap, f.Name, "the example sets every field")
			}
			require.Len(t, asMap, len(names), "the example has no other field")
		})
	}

	d, err := handlers.PayloadOf(handlers.TypeOrder)
	require.NoError(t, err)
	require.JSONEq(t, `{"region":"north","category":"books","customer_id":7,"amount_cents":1299}`, string(d.Example))
	require.Equal(t, []handlers.FieldDoc{
		{Name: "region", Type: "string", Meaning: "sales region: central, east, north, south or west"},
		{Name: "category", Type: "string", Meaning: "product category: apparel, books, electronics, garden, grocery or toys"},
		{Name: "customer_id", Type: "integer", Meaning: "the customer's number, >= 1"},
		{Name: "amount_cents", Type: "integer", Meaning: "the order's amount in cents, >= 1"},
	}, d.Fields)

	for _, f := range d.Fields {
		switch f.Name {
		case "region":
			for _, r := range database.Regions {
				require.Contains(t, f.Meaning, r, "the meaning lists every region")
			}
		case "category":
			for _, c := range database.Categories {
				require.Contains(t, f.Meaning, c, "the meaning lists every category")
			}
		}
	}

	_, err = handlers.PayloadOf("refund:issue")
	require.EqualError(t, err, `unknown job type "refund:issue" (job types: order:create, search:index, report:run)`)
}
