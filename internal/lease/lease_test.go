package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
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

// kubeBackend uses the fake clientset with reactors that keep the leases
// themselves and enforce resourceVersion on update and uniqueness on create,
// as the API server does (the fake's own tracker checks neither).
func kubeBackend() backend {
	var cs *fake.Clientset
	var once sync.Once
	return func(t *testing.T, id Identity, c *clock) Manager {
		once.Do(func() { cs = newLeaseAPI() })
		m, err := NewKubeManager(cs, "acme-dev", Config{Identity: id, Duration: 10 * time.Second, Skew: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		m.now = c.now
		return m
	}
}

// newLeaseAPI returns a clientset whose leases live in a map guarded by a
// mutex, with optimistic concurrency on resourceVersion.
func newLeaseAPI() *fake.Clientset {
	cs := fake.NewClientset()
	var mu sync.Mutex
	store := map[string]*coordinationv1.Lease{}
	version := 0
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	cs.PrependReactor("get", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		name := a.(k8stesting.GetAction).GetName()
		l, ok := store[name]
		if !ok {
			return true, nil, apierrors.NewNotFound(gr, name)
		}
		return true, l.DeepCopy(), nil
	})
	cs.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		l := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		if _, ok := store[l.Name]; ok {
			return true, nil, apierrors.NewAlreadyExists(gr, l.Name)
		}
		version++
		l.ResourceVersion = strconv.Itoa(version)
		store[l.Name] = l
		return true, l.DeepCopy(), nil
	})
	cs.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		cur, ok := store[l.Name]
		if !ok {
			return true, nil, apierrors.NewNotFound(gr, l.Name)
		}
		if cur.ResourceVersion != l.ResourceVersion {
			return true, nil, apierrors.NewConflict(gr, l.Name, errors.New("the object has been modified"))
		}
		version++
		l.ResourceVersion = strconv.Itoa(version)
		store[l.Name] = l
		return true, l.DeepCopy(), nil
	})
	return cs
}

func TestConformance(t *testing.T) {
	for name, mk := range map[string]func() backend{"file": fileBackend, "kube": kubeBackend} {
		t.Run(name, func(t *testing.T) {
			t.Run("exclusive, release, takeover", func(t *testing.T) { testExclusive(t, mk()) })
			t.Run("expiry", func(t *testing.T) { testExpiry(t, mk()) })
			t.Run("restart of the same replica", func(t *testing.T) { testRestart(t, mk()) })
			t.Run("race", func(t *testing.T) { testRace(t, mk()) })
		})
	}
}

func ids() (Identity, Identity) {
	return Identity{Holder: "pod-a", Incarnation: "a1", Address: "http://a"}, Identity{Holder: "pod-b", Incarnation: "b1", Address: "http://b"}
}

func testExclusive(t *testing.T, b backend) {
	ctx := context.Background()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	ia, ib := ids()
	a, bm := b(t, ia, c), b(t, ib, c)
	ra, err := a.Acquire(ctx, "conv-1")
	if err != nil || ra.Generation != 1 || ra.Address != "http://a" {
		t.Fatalf("a acquires: %+v, %v", ra, err)
	}
	var he *HeldError
	if _, err := bm.Acquire(ctx, "conv-1"); !errors.As(err, &he) || he.Record.Holder != "pod-a" || he.Record.Address != "http://a" {
		t.Fatalf("b while a holds: got %v, want HeldError naming pod-a", err)
	}
	if again, err := a.Acquire(ctx, "conv-1"); err != nil || again.Generation != 1 {
		t.Fatalf("a again: %+v, %v (want the same generation)", again, err)
	}
	if _, err := bm.Acquire(ctx, "conv-2"); err != nil {
		t.Fatalf("another lease is independent: %v", err)
	}
	if err := a.Release(ctx, "conv-1", 1); err != nil {
		t.Fatal(err)
	}
	rb, err := bm.Acquire(ctx, "conv-1")
	if err != nil || rb.Generation != 2 {
		t.Fatalf("b after release: %+v, %v, want generation 2", rb, err)
	}
	if _, err := a.Renew(ctx, "conv-1", 1); !errors.Is(err, ErrLost) {
		t.Errorf("a renews a lost lease: got %v, want ErrLost", err)
	}
	if err := a.Release(ctx, "conv-1", 1); err != nil {
		t.Errorf("releasing a lost lease: %v", err)
	}
	if got, _ := bm.Get(ctx, "conv-1"); got.Holder != "pod-b" || got.Released {
		t.Errorf("a's late release touched b's lease: %+v", got)
	}
}

func testExpiry(t *testing.T, b backend) {
	ctx := context.Background()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	ia, ib := ids()
	a, bm := b(t, ia, c), b(t, ib, c)
	if _, err := a.Acquire(ctx, "conv"); err != nil {
		t.Fatal(err)
	}
	c.add(10 * time.Second) // expired, but within the skew
	if _, err := bm.Acquire(ctx, "conv"); !errors.Is(err, ErrHeld) {
		t.Fatalf("b within the skew: got %v, want ErrHeld", err)
	}
	c.add(2 * time.Second)
	r, err := bm.Acquire(ctx, "conv")
	if err != nil || r.Generation != 2 {
		t.Fatalf("b after expiry: %+v, %v", r, err)
	}
	if _, err := a.Renew(ctx, "conv", 1); !errors.Is(err, ErrLost) {
		t.Errorf("a renews after takeover: got %v, want ErrLost", err)
	}
	// Renewal keeps b's lease alive past its first expiry.
	c.add(8 * time.Second)
	if _, err := bm.Renew(ctx, "conv", 2); err != nil {
		t.Fatal(err)
	}
	c.add(8 * time.Second)
	if _, err := a.Acquire(ctx, "conv"); !errors.Is(err, ErrHeld) {
		t.Errorf("a after b renewed: got %v, want ErrHeld", err)
	}
}

func testRestart(t *testing.T, b backend) {
	ctx := context.Background()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	ia, ib := ids()
	old := b(t, ia, c)
	if _, err := old.Acquire(ctx, "conv"); err != nil {
		t.Fatal(err)
	}
	restarted := ia
	restarted.Incarnation = "a2"
	r, err := b(t, restarted, c).Acquire(ctx, "conv")
	if err != nil || r.Generation != 2 || r.Incarnation != "a2" {
		t.Fatalf("restarted replica: %+v, %v, want immediate takeover", r, err)
	}
	if _, err := b(t, ib, c).Acquire(ctx, "conv"); !errors.Is(err, ErrHeld) {
		t.Errorf("another replica after the restart: got %v, want ErrHeld", err)
	}
}

func testRace(t *testing.T, b backend) {
	ctx := context.Background()
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	const n = 12
	for round, prep := range []func(){
		func() {},                     // a free lease
		func() { c.add(time.Minute) }, // an expired lease
	} {
		prep()
		var wins atomic.Int32
		var wg sync.WaitGroup
		ms := make([]Manager, n)
		for i := range ms {
			ms[i] = b(t, Identity{Holder: fmt.Sprintf("pod-%d-%d", round, i), Incarnation: "x"}, c)
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

func TestHeldValidity(t *testing.T) {
	ia, _ := ids()
	m, err := NewFileManager(t.TempDir(), Config{Identity: ia, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	h, err := Hold(context.Background(), m, "conv")
	if err != nil || !h.Valid() {
		t.Fatalf("hold: %v, valid %v", err, h.Valid())
	}
	time.Sleep(250 * time.Millisecond) // past two thirds of the duration
	if h.Valid() {
		t.Error("lease still trusted after its trust window without renewal")
	}
	if err := h.Renew(context.Background()); err != nil || !h.Valid() {
		t.Errorf("renew: %v, valid %v", err, h.Valid())
	}
	if err := h.Release(context.Background()); err != nil || h.Valid() {
		t.Errorf("release: %v, valid %v", err, h.Valid())
	}
}
