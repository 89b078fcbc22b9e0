package handlers_test

import (
	"context"
	"errors"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/priority"
)

// FuzzReportPayload feeds arbitrary payloads to the report handler's
// decoder: it must never panic; a payload it refuses is a permanent
// failure; one it accepts has a valid report name and period.
func FuzzReportPayload(f *testing.F) {
	f.Add([]byte(`{"report":"vat-return","period":"2026-10"}`))
	f.Add([]byte(`{"report":"../../etc/passwd","period":"2026-10"}`))
	f.Add([]byte(`{"report":"vat","period":"2026-13","extra":1}`))
	f.Add([]byte(`{"report":"vat"} {"report":"x"}`))
	f.Add([]byte(``))
	var got handlers.ReportPayload
	h := handlers.JSON(func(_ context.Context, p handlers.ReportPayload) error { got = p; return nil })
	f.Fuzz(func(t *testing.T, payload []byte) {
		got = handlers.ReportPayload{}
		err := h.ProcessTask(context.Background(), asynq.NewTask(handlers.TypeReport, payload))
		if err != nil {
			if !errors.Is(err, handlers.ErrMalformedPayload) || !errors.Is(err, asynq.SkipRetry) {
				t.Fatalf("a refused payload must be a permanent malformed-payload failure, got %v", err)
			}
			return
		}
		if err := priority.ValidateReportName(got.Report); err != nil {
			t.Fatalf("accepted %q: %v", payload, err)
		}
		if err := got.Validate(); err != nil {
			t.Fatalf("accepted %q: %v", payload, err)
		}
	})
}
