package web

import (
	"encoding/json"
	"net/http"
)

// Scene is what a program running the pools wants shown above them and
// drawn on the timeline. The demo's says which phase runs and what it does
// to the database and the orders: during its BEFORE phase the pools are
// idle and the story happens in one shared asynq server, which only the
// scene can show.
type Scene struct {
	// Title names what runs now; the timeline marks where it changes.
	Title string `json:"title"`
	// Note says it in a sentence.
	Note string `json:"note,omitempty"`
	// Gauges are shown as numbers and drawn on the timeline.
	Gauges []Gauge `json:"gauges"`
}

// Gauge is one number of a Scene.
type Gauge struct {
	// Key names it in the timeline's samples; Label on the page.
	Key   string  `json:"key"`
	Label string  `json:"label"`
	Value float64 `json:"value"`
	// Max, when above 0, is its limit (a pool's size, the connections
	// there are), drawn beside it.
	Max float64 `json:"max,omitempty"`
	// Alert marks a value to be read as trouble (orders timing out).
	Alert bool `json:"alert,omitempty"`
}

// historyJSON is what /api/history serves.
type historyJSON struct {
	EveryMS  int64    `json:"every_ms"`
	WindowMS int64    `json:"window_ms"`
	Samples  []Sample `json:"samples"`
	// Gauges are the scene's gauges now (labels and limits), for the
	// charts of Samples' gauges.
	Gauges []Gauge `json:"gauges,omitempty"`
}

// apiHistory serves the timeline: every sample kept, oldest first.
func (s *Server) apiHistory(w http.ResponseWriter, r *http.Request) {
	h := s.o.History
	if h == nil {
		text(w, http.StatusNotFound, "no timeline: this listener keeps none")
		return
	}
	out := historyJSON{EveryMS: h.every().Milliseconds(), WindowMS: h.window().Milliseconds(), Samples: h.Samples()}
	if out.Samples == nil {
		out.Samples = []Sample{}
	}
	if s.o.Scene != nil {
		out.Gauges = s.o.Scene().Gauges
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
