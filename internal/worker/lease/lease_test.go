package lease

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
)

// clock is a settable clock shared by the managers of one test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// backend makes managers for identities over one shared store.
type backend func(t *testing.T, id Identity, c *clock) Manager

func fileBackend() backend {
	var dir string
	var once sync.Once
	return func(t *testing.T, id Identity, c *clock) Manager {
		once.Do(func() { dir = t.TempDir() })
		m, err := NewFileManager(dir, Config{Identity: id, Duration: 10 * time.Second, Skew: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		m.now = c.now
		return m
	}
}

// kubeBackend keeps leases on the real API server (internal/kubetest), in a
// fresh namespace per case, acting as the worker does: a ServiceAccount
// token whose Role grants exactly leaseRules.
func kubeBackend() backend {
	var cs kubernetes.Interface
	var ns string
	var once sync.Once
	return func(t *testing.T, id Identity, c *clock) Manager {
		once.Do(func() { cs, ns = leaseClient(t, leaseRules) })
		m, err := NewKubeManager(cs, ns, Config{Identity: id, Duration: 10 * time.Second, Skew: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		m.now = c.now
		return m
	}
}

func TestConformance(t *testing.T) {
	for name, mk := range map[string]func() backend{"file": fileBackend, "kube": kubeBackend} {
		t.Run(name, func(t *testing.T) {
			t.Run("exclusive, release, takeover", func(t *testing.T) { testExclusive(t, mk()) })
			t.Run("a late release of an earlier holding", func(t *testing.T) { testLateRelease(t, mk()) })
			t.Run("expiry follows the replica lease", func(t *testing.T) { testExpiry(t, mk()) })
			t.Run("restart of the same replica", func(t *testing.T) { testRestart(t, mk()) })
			t.Run("replica release frees every conversation", func(t *testing.T) { testReplicaRelease(t, mk()) })
			t.Run("race", func(t *testing.T) { testRace(t, mk()) })
			t.Run("forget", func(t *testing.T) { testForget(t, mk()) })
		})
	}
}

func ids() (Identity, Identity) {
	return Identity{Holder: "pod-a", Incarnation: "a1", Address: "http://a"}, Identity{Holder: "pod-b", Incarnation: "b1", Address: "http://b"}
}

// started returns m after taking its replica lease.
func started(t *testing.T, m Manager) Manager {
	t.Helper()
	if _, err := m.Heartbeat(context.Background(), 0); err != nil {
		t.Fatalf("take replica lease: %v", err)
	}
	return m
}

func testExclusive(t *testing.T, b backend) {
	ctx := context.Background()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	ia, ib := ids()
	a, bm := started(t, b(t, ia, c)), started(t, b(t, ib, c))
	ra, err := a.Acquire(ctx, "conv-1")
	if err != nil || ra.Generation != 1 || ra.Address != "http://a" {
		t.Fatalf("a acquires: %+v, %v", ra, err)
	}
	var he *HeldError
	if _, err := bm.Acquire(ctx, "conv-1"); !errors.As(err, &he) || he.Record.Holder != "pod-a" || he.Record.Address != "http://a" || he.Record.ExpiresAt.IsZero() {
		t.Fatalf("b while a holds: got %v, want HeldError naming pod-a with its replica's expiry", err)
	}
	if again, err := a.Acquire(ctx, "conv-1"); err != nil || again.Generation != 2 {
		t.Fatalf("a again: %+v, %v (want a new generation)", again, err)
	}
	if _, err := bm.Acquire(ctx, "conv-2"); err != nil {
		t.Fatalf("another lease is independent: %v", err)
	}
	if err := a.Release(ctx, "conv-1", 2); err != nil {
		t.Fatal(err)
	}
	rb, err := bm.Acquire(ctx, "conv-1")
	if err != nil || rb.Generation != 3 {
		t.Fatalf("b after release: %+v, %v, want generation 3", rb, err)
	}
	if err := a.Release(ctx, "conv-1", 2); err != nil {
		t.Errorf("releasing a lost lease: %v", err)
	}
	if got, _ := bm.Get(ctx, "conv-1"); got.Holder != "pod-b" || got.Released || got.Generation != 3 {
		t.Errorf("a's late release touched b's lease: %+v", got)
	}
}

// testLateRelease is case W1 at the lease level: a process unloads a
// conversation (its release still on the way) while a new load of the same
// conversation in the same process takes the lease again. The late release
// of the first holding must leave the second alone.
func testLateRelease(t *testing.T, b backend) {
	ctx := context.Background()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	ia, ib := ids()
	a, bm := started(t, b(t, ia, c)), started(t, b(t, ib, c))
	first, err := a.Acquire(ctx, "conv")
	if err != nil {
		t.Fatal(err)
	}
	second, err := a.Acquire(ctx, "conv")
	if err != nil || second.Generation == first.Generation {
		t.Fatalf("reload: %+v, %v, want a generation other than %d", second, err, first.Generation)
	}
	if err := a.Release(ctx, "conv", first.Generation); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.Get(ctx, "conv"); got.Released || got.Generation != second.Generation || !got.HeldBy(ia) {
		t.Fatalf("after the late release of generation %d: %+v, want generation %d held by a", first.Generation, got, second.Generation)
	}
	if _, err := bm.Acquire(ctx, "conv"); !errors.Is(err, ErrHeld) {
		t.Errorf("b after a's late release: got %v, want ErrHeld", err)
	}
}

func testExpiry(t *testing.T, b backend) {
	ctx := context.Background()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	ia, ib := ids()
	a, bm := started(t, b(t, ia, c)), started(t, b(t, ib, c))
	if _, err := a.Acquire(ctx, "conv"); err != nil {
		t.Fatal(err)
	}
	// Heartbeats of a's replica keep its conversation without any write to
	// the conversation's lease.
	for range 4 {
		c.add(5 * time.Second)
		if _, err := a.Heartbeat(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if _, err := bm.Heartbeat(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := bm.Acquire(ctx, "conv"); !errors.Is(err, ErrHeld) {
		t.Fatalf("b while a's replica heartbeats: got %v, want ErrHeld", err)
	}
	c.add(10 * time.Second) // a's replica expired, but within the skew
	if _, err := bm.Acquire(ctx, "conv"); !errors.Is(err, ErrHeld) {
		t.Fatalf("b within the skew: got %v, want ErrHeld", err)
	}
	c.add(2 * time.Second)
	r, err := bm.Acquire(ctx, "conv")
	if err != nil || r.Generation != 2 {
		t.Fatalf("b after a's replica expired: %+v, %v", r, err)
	}
	// a comes back: its replica lease is still its own, but the
	// conversation is b's, and b's replica is alive.
	if _, err := a.Heartbeat(ctx, 1); err != nil {
		t.Fatalf("a renews its replica lease: %v", err)
	}
	if _, err := bm.Heartbeat(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, "conv"); !errors.Is(err, ErrHeld) {
		t.Errorf("a after b took over: got %v, want ErrHeld", err)
	}
}

func testRestart(t *testing.T, b backend) {
	ctx := context.Background()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	ia, ib := ids()
	old := started(t, b(t, ia, c))
	if _, err := old.Acquire(ctx, "conv"); err != nil {
		t.Fatal(err)
	}
	restarted := ia
	restarted.Incarnation = "a2"
	nm := b(t, restarted, c)
	if rep, err := nm.Heartbeat(ctx, 0); err != nil || rep.Generation != 2 {
		t.Fatalf("restarted replica takes its replica lease: %+v, %v", rep, err)
	}
	r, err := nm.Acquire(ctx, "conv")
	if err != nil || r.Generation != 2 || r.Incarnation != "a2" {
		t.Fatalf("restarted replica: %+v, %v, want immediate takeover", r, err)
	}
	if _, err := started(t, b(t, ib, c)).Acquire(ctx, "conv"); !errors.Is(err, ErrHeld) {
		t.Errorf("another replica after the restart: got %v, want ErrHeld", err)
	}
	if _, err := old.Heartbeat(ctx, 1); !errors.Is(err, ErrLost) {
		t.Errorf("the old incarnation renews: got %v, want ErrLost", err)
	}
}

func testReplicaRelease(t *testing.T, b backend) {
	ctx := context.Background()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	ia, ib := ids()
	a, bm := started(t, b(t, ia, c)), started(t, b(t, ib, c))
	for _, n := range []string{"c1", "c2", "c3"} {
		if _, err := a.Acquire(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.ReleaseReplica(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"c1", "c2", "c3"} {
		if _, err := bm.Acquire(ctx, n); err != nil {
			t.Errorf("b takes %s after a released its replica lease: %v", n, err)
		}
	}
}

func testRace(t *testing.T, b backend) {
	ctx := context.Background()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	const n = 12
	for round, prep := range []func(){
		func() {},                     // a free lease
		func() { c.add(time.Minute) }, // a lease whose holder expired
	} {
		prep()
		var wins atomic.Int32
		var wg sync.WaitGroup
		ms := make([]Manager, n)
		for i := range ms {
			ms[i] = started(t, b(t, Identity{Holder: fmt.Sprintf("pod-%d-%d", round, i), Incarnation: "x"}, c))
		}
		for i := range ms {
			wg.Go(func() {
				if _, err := ms[i].Acquire(ctx, "raced"); err == nil {
					wins.Add(1)
				} else if !errors.Is(err, ErrHeld) {
					t.Errorf("acquire: %v", err)
				}
			})
		}
		wg.Wait()
		if got := wins.Load(); got != 1 {
			t.Fatalf("round %d: %d replicas acquired the lease at once, want 1", round, got)
		}
	}
}

// TestLegacyRecordHonoured: a conversation lease written before replica
// leases (a per-conversation expiry, no replica lease) is held until its
// own expiry, so an upgraded replica does not take a conversation an old
// one still renews.
func TestLegacyRecordHonoured(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	_, ib := ids()
	m, err := NewFileManager(dir, Config{Identity: ib, Duration: 10 * time.Second, Skew: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m.now = c.now
	old := Record{Holder: "pod-old", Incarnation: "o1", Address: "http://old", Generation: 4, RenewedAt: c.now(), ExpiresAt: c.now().Add(10 * time.Second)}
	if won, err := take(filepath.Join(dir, "conv"), old); err != nil || !won {
		t.Fatal(won, err)
	}
	started(t, m)
	if _, err := m.Acquire(ctx, "conv"); !errors.Is(err, ErrHeld) {
		t.Fatalf("before the old record's expiry: got %v, want ErrHeld", err)
	}
	c.add(12 * time.Second)
	if r, err := m.Acquire(ctx, "conv"); err != nil || r.Generation != 5 {
		t.Fatalf("after the old record's expiry: %+v, %v", r, err)
	}
}

func TestReplicaTrust(t *testing.T) {
	ctx := context.Background()
	ia, _ := ids()
	m, err := NewFileManager(t.TempDir(), Config{Identity: ia, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var voids atomic.Int32
	r := NewReplica(m, func(error) { voids.Add(1) })
	h, err := r.Hold(ctx, "conv")
	if err != nil || !h.Valid() {
		t.Fatalf("hold: %v", err)
	}
	// Heartbeats inside the window keep every holding trusted.
	for range 6 {
		time.Sleep(50 * time.Millisecond)
		if err := r.Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
		if !h.Valid() {
			t.Fatal("holding not trusted though heartbeats came in time")
		}
	}
	time.Sleep(250 * time.Millisecond) // past two thirds of the duration
	if h.Valid() {
		t.Fatal("holding still trusted after the trust window without renewal")
	}
	// The late renewal succeeds, but what was held before stays void:
	// another replica may have taken it meanwhile.
	if err := r.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if h.Valid() || voids.Load() != 1 {
		t.Fatalf("after a late renewal: valid %v, voids %d; want invalid and one void", h.Valid(), voids.Load())
	}
	h2, err := r.Hold(ctx, "conv")
	if err != nil || !h2.Valid() {
		t.Fatalf("hold again: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !h2.Valid() {
		t.Fatal("releasing the void holding released the new one")
	}
	if err := h2.Release(ctx); err != nil || h2.Valid() {
		t.Fatalf("release: %v, valid %v", err, h2.Valid())
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Hold(ctx, "other"); !errors.Is(err, ErrLost) {
		t.Errorf("hold after the replica released: got %v, want ErrLost", err)
	}
}

// TestReplicaConcurrentHeartbeats: heartbeats from the renewal loop and
// from loads at once never make the replica lose its own lease (two
// renewals of one generation would conflict on the API server).
func TestReplicaConcurrentHeartbeats(t *testing.T) {
	ia, _ := ids()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	m := kubeBackend()(t, ia, c)
	r := NewReplica(m, func(err error) { t.Errorf("voided: %v", err) })
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if _, err := r.Hold(context.Background(), fmt.Sprintf("c%d", i)); err != nil {
				t.Errorf("hold: %v", err)
			}
			if err := r.Heartbeat(context.Background()); err != nil {
				t.Errorf("heartbeat: %v", err)
			}
		})
	}
	wg.Wait()
}

func testForget(t *testing.T, b backend) {
	ctx := context.Background()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	ia, _ := ids()
	a := started(t, b(t, ia, c))
	if _, err := a.Acquire(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if err := a.Forget(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Get(ctx, "gone"); err != nil || got.Generation != 0 {
		t.Fatalf("after Forget: %+v, %v; want no record", got, err)
	}
	if err := a.Forget(ctx, "gone"); err != nil {
		t.Errorf("forgetting a missing lease: %v", err)
	}
}
