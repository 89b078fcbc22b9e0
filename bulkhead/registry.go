package bulkhead

import (
	"errors"
	"fmt"
	"sync"
)

// ErrDuplicate is matched by the error Register returns for a name that is
// already registered.
var ErrDuplicate = errors.New("bulkhead: duplicate name")

// ErrNotFound is matched by the error Get returns for a name that was never
// registered.
var ErrNotFound = errors.New("bulkhead: not found")

// Registry gives each function its bulkhead by name. It is safe for
// concurrent use. The zero value is not usable; call NewRegistry.
type Registry struct {
	mu     sync.RWMutex
	byName map[string]*Bulkhead
	order  []*Bulkhead
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{byName: make(map[string]*Bulkhead)}
}

// Register creates a bulkhead from cfg and records it under cfg.Name. An
// invalid cfg or a name already registered is an error (the latter matches
// ErrDuplicate), and the registry is left unchanged.
func (r *Registry) Register(cfg Config) (*Bulkhead, error) {
	b, err := New(cfg)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.byName[cfg.Name]; ok {
		return nil, fmt.Errorf("%w: %q is already registered", ErrDuplicate, cfg.Name)
	}
	r.byName[cfg.Name] = b
	r.order = append(r.order, b)
	return b, nil
}

// Get returns the bulkhead registered under name; an unknown name is an error
// matching ErrNotFound that lists the names that do exist.
func (r *Registry) Get(name string) (*Bulkhead, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if b, ok := r.byName[name]; ok {
		return b, nil
	}
	names := make([]string, len(r.order))
	for i, b := range r.order {
		names[i] = b.name
	}
	return nil, fmt.Errorf("%w: %q (registered: %q)", ErrNotFound, name, names)
}

// All returns every registered bulkhead in registration order. The slice is
// the caller's to keep.
func (r *Registry) All() []*Bulkhead {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*Bulkhead, len(r.order))
	copy(out, r.order)
	return out
}

// Stats returns the stats of every registered bulkhead in registration order.
func (r *Registry) Stats() []Stats {
	all := r.All()
	out := make([]Stats, len(all))
	for i, b := range all {
		out[i] = b.Stats()
	}
	return out
}
