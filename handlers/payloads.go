package handlers

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	"github.com/lci-labs/compartment/internal/quote"
	"github.com/lci-labs/compartment/queues"
)

// PayloadDoc describes a job type's payload for people: what the job
// does, each field of its JSON, and a valid example.
type PayloadDoc struct {
	JobType string `json:"job_type"`
	// Summary says what a job of the type does.
	Summary string `json:"summary"`
	// Fields are the payload's fields in the order of its Go type.
	Fields []FieldDoc `json:"fields"`
	// Example is a valid payload: Check accepts it.
	Example json.RawMessage `json:"example"`
}

// FieldDoc is one field of a payload: its JSON name, its JSON type
// (string, integer, number, boolean, array, object) and what it means (the
// Go field's doc tag).
type FieldDoc struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Meaning string `json:"meaning"`
}

// Payloads describes the payload of every job type, in the order of
// JobTypes. Each description is read from the payload's Go type (its
// fields, their json and doc tags) and its Example method.
func Payloads() []PayloadDoc {
	return []PayloadDoc{
		describe(Order, "records an order (a row in the orders table)"),
		describe(Search, "creates or refreshes a product's search entry"),
		describe(Report, "runs one month-end report and writes its file; one job per report and period while it is queued or running"),
	}
}

// PayloadOf describes jobType's payload (see Payloads). An unknown job
// type is an error that lists the job types.
func PayloadOf(jobType string) (PayloadDoc, error) {
	for _, d := range Payloads() {
		if d.JobType == jobType {
			return d, nil
		}
	}
	return PayloadDoc{}, fmt.Errorf("unknown job type %s (job types: %s)", quote.Value(jobType), strings.Join(JobTypes(), ", "))
}

// describe reads job's payload type P: its fields and its example.
func describe[P interface{ Example() P }](job queues.Job[P], summary string) PayloadDoc {
	var zero P
	example, err := job.Encode(zero.Example())
	if err != nil {
		panic(fmt.Sprintf("handlers: the example payload of %q does not encode: %v", job.Type(), err))
	}
	return PayloadDoc{JobType: job.Type(), Summary: summary, Fields: fieldsOf(reflect.TypeFor[P]()), Example: example}
}

// fieldsOf lists the JSON fields of struct type t.
func fieldsOf(t reflect.Type) []FieldDoc {
	var out []FieldDoc
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, FieldDoc{Name: name, Type: jsonType(f.Type), Meaning: f.Tag.Get("doc")})
	}
	return out
}

// jsonType names the JSON type a Go type encodes to.
func jsonType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Pointer:
		return jsonType(t.Elem()) + " or null"
	default:
		return "object"
	}
}
