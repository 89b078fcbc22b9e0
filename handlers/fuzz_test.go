package handlers_test

import (
	"errors"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/queues"
)

// FuzzReportPayload feeds arbitrary payloads to the report job's decoder:
// it must never panic; a payload it refuses is a permanent failure; one it
// accepts has a valid report name and period.
func FuzzReportPayload(f *testing.F) {
	f.Add([]byte(`{"report":"vat-return","period":"2026-10"}`))
	f.Add([]byte(`{"report":"../../etc/passwd","period":"2026-10"}`))
	f.Add([]byte(`{"report":"vat","period":"2026-13","extra":1}`))
	f.Add([]byte(`{"report":"vat"} {"report":"x"}`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, payload []byte) {
		got, err := handlers.Report.Decode(payload)
		if err != nil {
			if !errors.Is(err, queues.ErrMalformedPayload) || !errors.Is(err, asynq.SkipRetry) {
				t.Fatalf("a refused payload must be a permanent malformed-payload failure, got %v", err)
			}
			return
		}
		if err := reports.ValidateName(got.Report); err != nil {
			t.Fatalf("accepted %q: %v", payload, err)
		}
		if err := got.Validate(); err != nil {
			t.Fatalf("accepted %q: %v", payload, err)
		}
	})
}
