// Package lease gives single ownership of a conversation across worker
// replicas: at most one replica holds a conversation's lease at a time, and
// every acquisition gets a higher generation number (the fencing token).
//
// The scheme has two levels, so that lease work follows the conversations a
// replica actively drives and not the number it ever held:
//
//   - Each worker process holds one replica lease, named by its Identity's
//     Holder (the pod name), which it renews every third of the lease
//     Duration (Replica.Heartbeat): one write per replica per period, at 1
//     or 1,000 active conversations alike.
//   - A conversation lease names the holding process (Holder and
//     Incarnation) and carries the generation. It is written twice: when
//     taken (generation+1) and when released. It needs no renewal: it is
//     alive exactly as long as the replica lease of the same incarnation is.
//
// Another process may take a conversation lease when it was released, when
// the holder's replica lease expired (plus a clock-skew allowance), was
// released, or belongs to another incarnation (the holder restarted), and
// when the holder is an earlier incarnation of its own replica. The holder
// trusts its holdings only for two thirds of the Duration after the start of
// its last successful replica renewal (its own monotonic clock); a renewal
// that completes after that trust window voids every holding of the
// process, even though the replica lease itself lives on, since another
// replica may have taken a conversation meanwhile.
//
// Two backends sit behind the Manager interface: FileManager keeps leases
// as files on the shared session volume using only operations NFS makes
// atomic (exclusive hard-link creation, rename), never file locks;
// KubeManager keeps them as coordination.k8s.io/v1 Lease objects with
// optimistic concurrency.
//
// Main types: Manager, Replica, Held, Record, Identity. It does not decide
// what to do with ownership; the harness does.
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
	// one machine). It survives restarts of the process; two live processes
	// never share it.
	Holder string
	// Incarnation is random per process start.
	Incarnation string
	// Address is the base URL where this replica serves its API, so another
	// replica can forward requests for conversations it owns.
	Address string
}

// Record is the state of one lease (a replica's or a conversation's).
type Record struct {
	Holder      string `json:"holder"`
	Incarnation string `json:"incarnation"`
	Address     string `json:"address"`
	// Generation rises by one with every acquisition: the fencing token.
	Generation int64 `json:"generation"`
	// RenewedAt is when the record was last written by its holder.
	RenewedAt time.Time `json:"renewed_at"`
	// ExpiresAt is when the lease ends without renewal. A conversation
	// record stores none; Get and HeldError fill it in from the holder's
	// replica lease. (Records written before replica leases carry their
	// own, and are honoured until it passes.)
	ExpiresAt time.Time `json:"expires_at"`
	Released  bool      `json:"released,omitempty"`
}

// HeldBy reports whether r is held by exactly this process.
func (r Record) HeldBy(id Identity) bool {
	return r.Holder == id.Holder && r.Incarnation == id.Incarnation && !r.Released
}

// replicaFreeFor reports whether id may take the replica lease r at now:
// nobody holds it, it was released or expired (beyond skew), or it is held
// by an earlier incarnation of id's replica (which is therefore dead).
func (r Record) replicaFreeFor(id Identity, now time.Time, skew time.Duration) bool {
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

// convLive reports whether the conversation record cur is still held, given
// its holder's replica record rep, at now, and until when (zero when not
// held): the replica lease must be the same incarnation's, unreleased and
// unexpired. A record from before replica leases (no live replica, an
// expiry of its own) is held until that expiry.
func convLive(cur, rep Record, now time.Time, skew time.Duration) (bool, time.Time) {
	if cur.Generation == 0 || cur.Released {
		return false, time.Time{}
	}
	exp := cur.ExpiresAt // a record from before replica leases
	if rep.Generation != 0 && rep.Holder == cur.Holder && rep.Incarnation == cur.Incarnation && !rep.Released {
		exp = rep.ExpiresAt
	}
	if exp.IsZero() || now.After(exp.Add(skew)) {
		return false, time.Time{}
	}
	return true, exp
}

// Errors returned by Manager and Replica methods.
var (
	// ErrHeld: another live process holds the lease; HeldError carries it.
	ErrHeld = errors.New("lease held by another replica")
	// ErrLost: the caller's generation is no longer current.
	ErrLost = errors.New("lease lost")
	// ErrNotTrusted: this process's replica lease is not renewed recently
	// enough to take conversations (see the package doc).
	ErrNotTrusted = errors.New("replica lease not trusted")
)

// HeldError is ErrHeld with the current record.
type HeldError struct{ Record Record }

func (e *HeldError) Error() string {
	return fmt.Sprintf("lease held by %s (generation %d, until %s)", e.Record.Holder, e.Record.Generation, e.Record.ExpiresAt.Format(time.RFC3339Nano))
}
func (e *HeldError) Unwrap() error { return ErrHeld }

// Manager is a lease backend for one identity. Replica drives it; the
// harness uses Replica and Held, not Manager.
type Manager interface {
	// Heartbeat takes this identity's replica lease when gen is 0
	// (*HeldError when another live process has the Holder name), or
	// renews generation gen (ErrLost when it is no longer this
	// process's). It returns the record written.
	Heartbeat(ctx context.Context, gen int64) (Record, error)
	// ReleaseReplica gives the replica lease of generation gen up: every
	// conversation lease this process holds becomes free at once.
	ReleaseReplica(ctx context.Context, gen int64) error
	// Acquire takes the conversation lease of name with the next
	// generation when it is free for this identity (see the package doc);
	// a record of this very process counts as free (the caller holds each
	// name at most once). It returns a *HeldError when another live
	// process holds it. The caller must hold a live replica lease.
	Acquire(ctx context.Context, name string) (Record, error)
	// Release gives the conversation lease of generation gen up so others
	// may take it at once. Releasing a lease that is no longer gen, or no
	// longer this process's, is not an error and changes nothing.
	Release(ctx context.Context, name string, gen int64) error
	// Forget removes the conversation lease of name for good (the
	// conversation was deleted); the next acquisition starts again at
	// generation 1. Forgetting a missing lease is not an error.
	Forget(ctx context.Context, name string) error
	// Get returns the conversation's current record (Generation 0 when
	// none exists), with ExpiresAt from its holder's replica lease, zero
	// when the holding is not alive.
	Get(ctx context.Context, name string) (Record, error)
	// Replica returns holder's replica lease record (Generation 0 when
	// none exists).
	Replica(ctx context.Context, holder string) (Record, error)
	// Duration is how long a replica lease lasts without renewal.
	Duration() time.Duration
}

// Config is shared by the implementations.
type Config struct {
	Identity Identity
	// Duration of a replica lease without renewal. Default 15 s.
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

// trustWindow is how long after the start of a successful renewal the
// holder acts on its leases: two thirds of the duration, leaving a third as
// margin.
func trustWindow(d time.Duration) time.Duration { return d * 2 / 3 }

// Replica is this process's replica lease and the trust it gives the
// conversation leases taken under it. Call Heartbeat every third of the
// Duration (RenewEvery); when the trust lapses or the replica lease is
// lost, every Held taken so far turns invalid for good and onVoid is
// called (from the goroutine that noticed), so the owner can drop what it
// drives. Its methods are safe for concurrent use.
type Replica struct {
	m      Manager
	onVoid func(error)

	// beat serializes heartbeats: two renewals of one generation at once
	// would conflict with each other.
	beat sync.Mutex

	mu sync.Mutex
	// gen is the replica lease's generation, 0 before the first
	// heartbeat; guarded by mu.
	gen int64
	// deadline is the end of the trust window; guarded by mu.
	deadline time.Time
	// epoch counts voids; a Held is valid only in the epoch it was taken
	// in; guarded by mu.
	epoch uint64
	// closed is set once the replica lease is released or lost to another
	// incarnation: nothing is taken any more; guarded by mu.
	closed error
}

// NewReplica returns the replica lease of m's identity, not yet taken
// (the first Heartbeat or Hold takes it). onVoid may be nil.
func NewReplica(m Manager, onVoid func(error)) *Replica {
	if onVoid == nil {
		onVoid = func(error) {}
	}
	return &Replica{m: m, onVoid: onVoid}
}

// RenewEvery is how often Heartbeat should run: a third of the Duration.
func (r *Replica) RenewEvery() time.Duration { return r.m.Duration() / 3 }

// Heartbeat takes or renews the replica lease. A renewal that completes
// after the trust window voids every holding (onVoid gets ErrNotTrusted);
// ErrLost (another incarnation of this Holder took the replica lease)
// voids them and closes the Replica for good.
func (r *Replica) Heartbeat(ctx context.Context) error {
	r.beat.Lock()
	defer r.beat.Unlock()
	start := time.Now()
	r.mu.Lock()
	gen, closed, deadline := r.gen, r.closed, r.deadline
	r.mu.Unlock()
	if closed != nil {
		return closed
	}
	rec, err := r.m.Heartbeat(ctx, gen)
	r.mu.Lock()
	if err != nil {
		var voidErr error
		switch {
		case errors.Is(err, ErrLost):
			r.closed = fmt.Errorf("replica lease: %w", err)
			voidErr = r.voidLocked(err)
		case !deadline.IsZero() && time.Now().After(deadline):
			voidErr = r.voidLocked(fmt.Errorf("%w: no renewal within the trust window: %v", ErrNotTrusted, err))
		}
		r.mu.Unlock()
		if voidErr != nil {
			r.onVoid(voidErr)
		}
		return err
	}
	var voidErr error
	if !deadline.IsZero() && time.Now().After(deadline) {
		voidErr = r.voidLocked(fmt.Errorf("%w: renewal completed %s after the trust window", ErrNotTrusted, time.Since(deadline).Round(time.Millisecond)))
	}
	r.gen = rec.Generation
	r.deadline = start.Add(trustWindow(r.m.Duration()))
	r.mu.Unlock()
	if voidErr != nil {
		r.onVoid(voidErr)
	}
	return nil
}

// voidLocked ends the current epoch; r.mu is held. It returns the error
// for onVoid, called by the caller after unlocking.
func (r *Replica) voidLocked(err error) error {
	r.epoch++
	r.deadline = time.Time{}
	return err
}

// trusts reports whether a holding of epoch may still be acted on.
func (r *Replica) trusts(epoch uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed == nil && epoch == r.epoch && time.Now().Before(r.deadline)
}

// Hold takes the conversation lease of name (heartbeating first when the
// replica lease is not trusted now). Errors: *HeldError, ErrNotTrusted,
// ErrLost (the Replica is closed), or the backend's.
func (r *Replica) Hold(ctx context.Context, name string) (*Held, error) {
	r.mu.Lock()
	ok := r.closed == nil && r.gen != 0 && time.Now().Before(r.deadline)
	r.mu.Unlock()
	if !ok {
		if err := r.Heartbeat(ctx); err != nil {
			return nil, err
		}
	}
	r.mu.Lock()
	epoch, closed := r.epoch, r.closed
	r.mu.Unlock()
	if closed != nil {
		return nil, closed
	}
	rec, err := r.m.Acquire(ctx, name)
	if err != nil {
		return nil, err
	}
	h := &Held{r: r, name: name, rec: rec, epoch: epoch}
	if !r.trusts(epoch) {
		_ = h.Release(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("take lease %s: %w", name, ErrNotTrusted)
	}
	return h, nil
}

// Release gives the replica lease up (every holding with it) and closes the
// Replica: Hold fails afterwards.
func (r *Replica) Release(ctx context.Context) error {
	r.mu.Lock()
	gen := r.gen
	if r.closed == nil {
		r.closed = fmt.Errorf("replica lease released: %w", ErrLost)
	}
	r.epoch++
	r.deadline = time.Time{}
	r.mu.Unlock()
	if gen == 0 {
		return nil
	}
	return r.m.ReleaseReplica(ctx, gen)
}

// Held is one conversation lease this process holds. Valid tells whether it
// can still be trusted: its Replica's trust covers it and it was not
// released. Its methods are safe for concurrent use.
type Held struct {
	r     *Replica
	name  string
	rec   Record
	epoch uint64

	mu sync.Mutex
	// released is set by Release; guarded by mu.
	released bool
}

// Record returns the record as of the acquisition.
func (h *Held) Record() Record { return h.rec }

// Generation is the fencing token.
func (h *Held) Generation() int64 { return h.rec.Generation }

// Valid reports whether the holder may still act on the lease.
func (h *Held) Valid() bool {
	h.mu.Lock()
	released := h.released
	h.mu.Unlock()
	return !released && h.r.trusts(h.epoch)
}

// Release gives the lease up; Valid is false afterwards. Releasing twice is
// harmless.
func (h *Held) Release(ctx context.Context) error {
	h.mu.Lock()
	already := h.released
	h.released = true
	h.mu.Unlock()
	if already {
		return nil
	}
	return h.r.m.Release(ctx, h.name, h.rec.Generation)
}
