package app

import (
	"time"

	"github.com/lci-labs/compartment/queues"
)

// BreakerFile is a pool's circuit breaker as written (breaker: in a
// pool): one key for each field of queues.BreakerConfig, named by its json
// tag, with that field's meaning and default (docs/CONFIG.md lists them;
// docs/BREAKER.md says how the breaker works).
type BreakerFile struct {
	FailureRatio float64       `yaml:"failure_ratio,omitempty"`
	MinCalls     int           `yaml:"min_calls,omitempty"`
	Window       time.Duration `yaml:"window,omitempty"`
	SlowCall     time.Duration `yaml:"slow_call,omitempty"`
	CoolDown     time.Duration `yaml:"cool_down,omitempty"`
	MaxCoolDown  time.Duration `yaml:"max_cool_down,omitempty"`
	Probes       int           `yaml:"probes,omitempty"`
}

func (b *BreakerFile) engine() *queues.BreakerConfig {
	if b == nil {
		return nil
	}
	return &queues.BreakerConfig{
		FailureRatio: b.FailureRatio, MinCalls: b.MinCalls, Window: b.Window, SlowCall: b.SlowCall,
		CoolDown: b.CoolDown, MaxCoolDown: b.MaxCoolDown, Probes: b.Probes,
	}
}
