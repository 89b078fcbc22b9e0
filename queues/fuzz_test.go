package queues_test

import (
	"testing"

	"github.com/lci-labs/compartment/queues"
)

// FuzzConfig feeds arbitrary text to the config loader: it must never panic,
// and whatever it accepts must be a config the runner can be built from.
func FuzzConfig(f *testing.F) {
	f.Add([]byte(validConfig))
	f.Add([]byte("redis:\n  embedded: true\npools:\n  - name: a\n    size: 1\n    job_types: [x]\n"))
	f.Add([]byte("pools: [{name: a, size: -1, job_types: [x], job_timeout: 500ms}]\n"))
	f.Add([]byte("redis: {url: 'rediss://:pw@h:6380/2'}\npools: [{name: b, size: 2, job_types: [y], queue_order: weighted, weights: {a: 1}}]\n"))
	f.Add([]byte("{{{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := queues.Parse(data, "fuzz.yaml", queues.LoadOptions{})
		if err != nil {
			return
		}
		if err := cfg.Validate(nil); err != nil {
			t.Fatalf("accepted a config that does not validate: %v", err)
		}
		reg, err := queues.NewRegistryFromConfig(cfg)
		if err != nil {
			t.Fatalf("accepted a config the registry refuses: %v", err)
		}
		for _, p := range reg.Pools() {
			if p.Size() < 1 || len(p.Queues()) == 0 {
				t.Fatalf("pool %q: size %d, queues %v", p.Name(), p.Size(), p.Queues())
			}
		}
	})
}
