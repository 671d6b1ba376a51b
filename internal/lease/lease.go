// Package lease gives single ownership of a conversation across worker
// replicas: at most one replica holds a conversation's lease at a time, and
// every acquisition gets a higher generation number (the fencing token).
//
// Two implementations sit behind the Manager interface: FileManager keeps
// leases as files on the shared session volume using only operations NFS
// makes atomic (exclusive hard-link creation, rename), never file locks;
// KubeManager keeps them as coordination.k8s.io/v1 Lease objects with
// optimistic concurrency. Both treat a record held by an earlier
// incarnation of the same replica identity as free, so a restarted replica
// does not lock itself out of its own sessions until a timeout.
//
// Main types: Manager, Record, Identity, Held. It does not decide what to do
// with ownership; the harness does.
package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Identity names one worker process.
type Identity struct {
	// Holder is the replica's stable name (the pod name; the host name on
	// one machine). It survives restarts of the process.
	Holder string
	// Incarnation is random per process start.
	Incarnation string
	// Address is the base URL where this replica serves its API, so another
	// replica can forward requests for conversations it owns.
	Address string
}

// Record is the state of one lease.
type Record struct {
	Holder      string    `json:"holder"`
	Incarnation string    `json:"incarnation"`
	Address     string    `json:"address"`
	Generation  int64     `json:"generation"`
	RenewedAt   time.Time `json:"renewed_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	Released    bool      `json:"released,omitempty"`
}

// HeldBy reports whether r is held by exactly this process.
func (r Record) HeldBy(id Identity) bool {
	return r.Holder == id.Holder && r.Incarnation == id.Incarnation && !r.Released
}

// freeFor reports whether id may take the lease at now: nobody holds it, it
// was released, it expired (beyond skew), or it is held by an earlier
// incarnation of id's replica (which is therefore dead).
func (r Record) freeFor(id Identity, now time.Time, skew time.Duration) bool {
	switch {
	case r.Generation == 0, r.Released:
		return true
	case r.Holder == id.Holder && r.Incarnation != id.Incarnation:
		return true
	case now.After(r.ExpiresAt.Add(skew)):
		return true
	}
	return false
}

// Errors returned by Manager methods.
var (
	// ErrHeld: another live process holds the lease; HeldError carries it.
	ErrHeld = errors.New("lease held by another replica")
	// ErrLost: the caller's generation is no longer current.
	ErrLost = errors.New("lease lost")
)

// HeldError is ErrHeld with the current record.
type HeldError struct{ Record Record }

func (e *HeldError) Error() string {
	return fmt.Sprintf("lease held by %s (generation %d, until %s)", e.Record.Holder, e.Record.Generation, e.Record.ExpiresAt.Format(time.RFC3339Nano))
}
func (e *HeldError) Unwrap() error { return ErrHeld }

// Manager acquires, renews and releases named leases for one identity.
type Manager interface {
	// Acquire takes the lease of name when it is free for this identity
	// (see the package doc) and returns the new record; when this process
	// already holds it, it renews it. It returns a *HeldError when another
	// live process holds it.
	Acquire(ctx context.Context, name string) (Record, error)
	// Renew extends the lease of generation gen; ErrLost when another
	// acquisition happened.
	Renew(ctx context.Context, name string, gen int64) (Record, error)
	// Release gives the lease of generation gen up so others may take it
	// at once. Releasing a lost lease is not an error.
	Release(ctx context.Context, name string, gen int64) error
	// Get returns the current record (Generation 0 when none exists).
	Get(ctx context.Context, name string) (Record, error)
	// Duration is how long a lease lasts without renewal.
	Duration() time.Duration
}

// Config is shared by the implementations.
type Config struct {
	Identity Identity
	// Duration of a lease without renewal. Default 15 s.
	Duration time.Duration
	// Skew is the clock difference tolerated between replicas before an
	// expired lease is taken. Default 2 s.
	Skew time.Duration
}

func (c *Config) setDefaults() error {
	if c.Identity.Holder == "" || c.Identity.Incarnation == "" {
		return errors.New("lease config: identity holder and incarnation are required")
	}
	if c.Duration <= 0 {
		c.Duration = 15 * time.Second
	}
	if c.Skew <= 0 {
		c.Skew = 2 * time.Second
	}
	return nil
}

// Held is one lease this process holds, kept alive by Keep. Valid tells,
// from this process's own monotonic clock, whether the lease can still be
// trusted: it turns false a margin before the lease could expire for
// others, so a holder that cannot renew stops acting before anyone else may
// start.
// Its methods are safe for concurrent use.
type Held struct {
	m    Manager
	name string

	mu sync.Mutex
	// rec is the record as of the last acquisition or renewal; guarded by mu.
	rec Record
	// deadline is when this process must stop trusting the lease: the last
	// successful (re)acquisition plus two thirds of Duration; guarded by mu.
	deadline time.Time
}

// Hold acquires name and returns its Held.
func Hold(ctx context.Context, m Manager, name string) (*Held, error) {
	start := time.Now()
	rec, err := m.Acquire(ctx, name)
	if err != nil {
		return nil, err
	}
	return &Held{m: m, name: name, rec: rec, deadline: start.Add(trustWindow(m.Duration()))}, nil
}

// trustWindow is how long after a successful renewal the holder acts on the
// lease: two thirds of its duration, leaving a third as margin.
func trustWindow(d time.Duration) time.Duration { return d * 2 / 3 }

// Record returns the record as of the last acquisition or renewal.
func (h *Held) Record() Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rec
}

// Generation is the fencing token.
func (h *Held) Generation() int64 { return h.Record().Generation }

// Valid reports whether the holder may still act on the lease.
func (h *Held) Valid() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Now().Before(h.deadline)
}

// Renew extends the lease. On failure Valid eventually turns false (at
// once for ErrLost).
func (h *Held) Renew(ctx context.Context) error {
	start := time.Now()
	gen := h.Generation()
	rec, err := h.m.Renew(ctx, h.name, gen)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		if errors.Is(err, ErrLost) {
			h.deadline = time.Time{}
		}
		return err
	}
	if h.deadline.IsZero() {
		return fmt.Errorf("renew lease %s: %w (released)", h.name, ErrLost)
	}
	h.rec = rec
	h.deadline = start.Add(trustWindow(h.m.Duration()))
	return nil
}

// Release gives the lease up; Valid is false afterwards.
func (h *Held) Release(ctx context.Context) error {
	h.mu.Lock()
	h.deadline = time.Time{}
	gen := h.rec.Generation
	h.mu.Unlock()
	return h.m.Release(ctx, h.name, gen)
}
