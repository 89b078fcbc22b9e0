package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/lci-labs/compartment/internal/quote"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/queues"
)

// TypeBundle is a month-end's completion step: when every report of a
// month-end run has ended, the run enqueues it once (a plan's on_complete),
// and it writes the month's manifest next to the report files. Optional: a
// config that routes it to no pool simply has no bundle.
const TypeBundle = "report:bundle"

// Bundle is the completion step's job.
var Bundle = queues.NewJob[BundlePayload](TypeBundle)

// OptionalJobTypes lists the job types Register handles when a pool
// serves them.
func OptionalJobTypes() []string { return []string{TypeBundle} }

// BundlePayload is the payload a month-end run gives its completion step:
// the run's summary (added by the engine) and whom to tell (the plan's).
type BundlePayload struct {
	Run    queues.RunSummary `json:"run"`
	Notify string            `json:"notify,omitempty"`
}

// Validate checks that the payload names a run and its period.
func (p *BundlePayload) Validate() error {
	if p.Run.ID == "" {
		return errors.New("run.id is required (the engine fills the run's summary in)")
	}
	if _, err := reports.ParsePeriod(p.Run.Period); err != nil {
		return fmt.Errorf("run.period: %w", err)
	}
	return nil
}

// Manifest is what the bundle writes: the run's summary and the report
// files of its period found in the output directory.
type Manifest struct {
	Run    queues.RunSummary `json:"run"`
	Notify string            `json:"notify,omitempty"`
	Files  []string          `json:"files"`
}

// ManifestName is the bundle's file for period, in the output directory.
func ManifestName(p reports.Period) string { return "month-end_" + p.String() + ".json" }

// writeBundle writes the manifest of p's run into dir (through a temporary
// file and a rename: a reader never sees half of it) and returns its path.
func writeBundle(ctx context.Context, dir string, p BundlePayload) (string, error) {
	period, _ := reports.ParsePeriod(p.Run.Period) // checked by Validate
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("bundle: read %s: %w", dir, err)
	}
	m := Manifest{Run: p.Run, Notify: p.Notify, Files: []string{}}
	suffix := "_" + period.String() + ".csv"
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), suffix) {
			m.Files = append(m.Files, e.Name())
		}
	}
	slices.Sort(m.Files)
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return "", fmt.Errorf("bundle: %w", err)
	}
	if err := queues.CheckFence(ctx); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".bundle-*")
	if err != nil {
		return "", fmt.Errorf("bundle: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, there is nothing to remove
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return "", fmt.Errorf("bundle: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("bundle: %w", err)
	}
	final := filepath.Join(dir, ManifestName(period))
	if err := os.Rename(tmp.Name(), final); err != nil {
		return "", fmt.Errorf("bundle: %w", err)
	}
	return final, nil
}

// checkBundle is Check's case for TypeBundle.
func checkBundle(payload []byte) error {
	_, err := Bundle.Decode(payload)
	if err != nil {
		return fmt.Errorf("job type %s: %w", quote.Value(TypeBundle), err)
	}
	return nil
}
