package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/worker/lease"
)

// churn opens and drops conv's event stream n times from each of loops
// goroutines, each stream held for hold: every drop of the last follower
// unloads the conversation and every open loads it again.
func churn(t *testing.T, h *Harness, conv string, loops, n int, hold time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	for range loops {
		wg.Go(func() {
			for range n {
				ctx, cancel := context.WithTimeout(context.Background(), hold)
				err := h.Follow(ctx, conv, 0, 0, func(contract.Event) error { return nil }, nil, func() error { return nil })
				cancel()
				if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
					t.Errorf("follow: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestW1LoadUnloadKeepsOwnLease is case W1 without the model: streams of an
// idle conversation open and close from three loops while a fourth stream
// stays open (the conversation loaded). Whatever the interleaving of loads
// and unloads, the loaded session's lease stays this process's current,
// unreleased generation: its own unloads never release it. 200 rounds.
func TestW1LoadUnloadKeepsOwnLease(t *testing.T) {
	r := startRig(t, rigOptions{})
	mustCreate(t, r.h, "w1")
	for round := range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		started := make(chan error, 1)
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { churn(t, r.h, "w1", 3, 4, time.Millisecond) })
		go func() {
			defer close(done)
			err := r.h.Follow(ctx, "w1", 0, 0, func(contract.Event) error { return nil }, nil, func() error { started <- nil; return nil })
			select {
			case started <- err:
			default:
			}
		}()
		if err := <-started; err != nil {
			t.Fatalf("round %d: follow: %v", round, err)
		}
		wg.Wait()
		r.h.mu.Lock()
		s := r.h.sessions["w1"]
		r.h.mu.Unlock()
		if s == nil || s.held == nil {
			t.Fatalf("round %d: the conversation is not loaded though a stream is open", round)
		}
		rec, err := r.h.cfg.Leases.Get(context.Background(), "w1")
		if err != nil {
			t.Fatal(err)
		}
		if rec.Released || rec.Generation != s.held.Generation() || !rec.HeldBy(r.h.cfg.Identity) || !s.held.Valid() {
			t.Fatalf("round %d: the loaded session holds generation %d (valid %v); the lease says %+v", round, s.held.Generation(), s.held.Valid(), rec)
		}
		cancel()
		<-done
	}
}

// TestW1TurnSurvivesStreamChurn is case W1 with the real CLI: three loops
// open the idle conversation's stream for 30 ms and drop it, and meanwhile
// messages are sent whose model answers take longer than a lease duration.
// Every turn completes; none fails with worker_restarted, though loads and
// unloads race with the load that starts each turn.
func TestW1TurnSurvivesStreamChurn(t *testing.T) {
	up := devupstream.New(devupstream.Config{})
	r := startRig(t, rigOptions{upstream: up})
	mustCreate(t, r.h, "w1")
	// stored reads the conversation's events without keeping it loaded.
	stored := func(typ contract.EventType) int {
		l, err := r.h.Events("w1")
		if err != nil {
			t.Fatal(err)
		}
		evs, err := l.Since(0, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range evs {
			if e.Type == typ {
				n++
			}
		}
		return n
	}
	for i, id := range []string{"m1", "m2", "m3"} {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				churn(t, r.h, "w1", 3, 1, 30*time.Millisecond)
			}
		})
		// Longer than the lease duration (3 s): renewals happen during it.
		up.Script(devupstream.Response{Content: []devupstream.ContentBlock{devupstream.Text("a slow answer")}, FirstByteDelay: 4 * time.Second})
		time.Sleep(100 * time.Millisecond)
		mustSend(t, r.h, "w1", id, "answer slowly")
		waitFor(t, "the turn's end", 90*time.Second, func() bool {
			return stored(contract.EventTurnCompleted)+stored(contract.EventTurnFailed) > i
		})
		close(stop)
		wg.Wait()
		if n := stored(contract.EventTurnFailed); n > 0 {
			t.Fatalf("turn %s: %d turns failed while the stream was opened and closed", id, n)
		}
	}
}

// countingLeases counts the calls of a lease backend.
type countingLeases struct {
	lease.Manager
	heartbeats, acquires, releases atomic.Int64
}

func (c *countingLeases) Heartbeat(ctx context.Context, gen int64) (lease.Record, error) {
	c.heartbeats.Add(1)
	return c.Manager.Heartbeat(ctx, gen)
}

func (c *countingLeases) Acquire(ctx context.Context, name string) (lease.Record, error) {
	c.acquires.Add(1)
	return c.Manager.Acquire(ctx, name)
}

func (c *countingLeases) Release(ctx context.Context, name string, gen int64) error {
	c.releases.Add(1)
	return c.Manager.Release(ctx, name, gen)
}

func (c *countingLeases) reset() (heartbeats, acquires, releases int64) {
	return c.heartbeats.Swap(0), c.acquires.Swap(0), c.releases.Swap(0)
}

// TestLeaseWorkFollowsActiveConversations: 1,000 conversations are created
// and left idle: none stays loaded, and while idle the worker's only lease
// work is its replica lease's heartbeat. Then all 1,000 are followed
// (loaded, active): each is taken once, and over three renewal periods the
// lease work is still one heartbeat per period, every holding stays
// trusted, and the replica lease is never older than one period.
func TestLeaseWorkFollowsActiveConversations(t *testing.T) {
	const n = 1000
	counter := &countingLeases{}
	// What is counted is lease work, not disk speed: the volume may be in
	// memory (1,000 creates on a disk that syncs in 3 ms take half a minute).
	vol := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "talkide-leasework-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		vol = d
	}
	r := startRig(t, rigOptions{volume: vol, wrapLeases: func(m lease.Manager) lease.Manager { counter.Manager = m; return counter }})
	convs := make([]string, n)
	for i := range convs {
		convs[i] = fmt.Sprintf("c%04d", i)
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range work {
				// 50 per user: under the per-user quota.
				user := fmt.Sprintf("u%d", i/50)
				if _, err := r.h.CreateSession(convs[i], contract.CreateSessionRequest{UserID: user}); err != nil {
					t.Errorf("create %s: %v", convs[i], err)
				}
			}
		})
	}
	for i := range convs {
		work <- i
	}
	close(work)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if got := len(r.h.loaded()); got != 0 {
		t.Fatalf("%d of %d idle conversations stay loaded", got, n)
	}
	if fds := openFilesUnder(t, r.h.store.Dir("")); fds != 0 {
		t.Fatalf("%d files of the session store open with every conversation idle", fds)
	}
	_, acq, rel := counter.reset()
	if acq != n || rel != n {
		t.Fatalf("creating %d conversations took %d leases and released %d, want %d each", n, acq, rel, n)
	}
	period := r.h.replica.RenewEvery()
	time.Sleep(2 * period)
	if hb, acq, rel := counter.reset(); hb > 3 || acq != 0 || rel != 0 {
		t.Fatalf("idle for two renewal periods: %d heartbeats, %d acquisitions, %d releases; want at most 3 heartbeats and nothing else", hb, acq, rel)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var followers sync.WaitGroup
	startedc := make(chan error, n)
	for _, c := range convs {
		followers.Go(func() {
			err := r.h.Follow(ctx, c, 0, 0, func(contract.Event) error { return nil }, nil, func() error { startedc <- nil; return nil })
			if err != nil && ctx.Err() == nil {
				startedc <- err
			}
		})
	}
	for range n {
		if err := <-startedc; err != nil {
			t.Fatalf("follow: %v", err)
		}
	}
	if got := len(r.h.loaded()); got != n {
		t.Fatalf("%d conversations loaded with %d followed", got, n)
	}
	_, acq, _ = counter.reset()
	if acq != n {
		t.Fatalf("following %d conversations took %d leases", n, acq)
	}
	for range 3 {
		time.Sleep(period)
		rec, err := counter.Replica(context.Background(), r.h.cfg.Identity.Holder)
		if err != nil {
			t.Fatal(err)
		}
		if age := time.Since(rec.RenewedAt); age > 2*period {
			t.Errorf("replica lease last renewed %s ago with %d active conversations (renewal period %s)", age, n, period)
		}
		for _, s := range r.h.loaded() {
			if !s.held.Valid() {
				t.Fatalf("conversation %s's lease not trusted with %d active conversations", s.conv, n)
			}
		}
	}
	if hb, acq, rel := counter.reset(); hb > 4 || acq != 0 || rel != 0 {
		t.Errorf("three renewal periods with %d active conversations: %d heartbeats, %d acquisitions, %d releases; want at most 4 heartbeats and nothing else", n, hb, acq, rel)
	}
	cancel()
	followers.Wait()
}

// openFilesUnder counts this process's open files under dir.
func openFilesUnder(t *testing.T, dir string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.HasPrefix(target, dir) {
			n++
		}
	}
	return n
}

// TestDeleteForgetsTheLease: a deleted conversation leaves no lease behind
// (months of deleted conversations would otherwise pile up lease files or
// Lease objects).
func TestDeleteForgetsTheLease(t *testing.T) {
	r := startRig(t, rigOptions{})
	mustCreate(t, r.h, "doomed")
	r.follow(t, "doomed") // loaded, its lease held
	if rec, err := r.h.cfg.Leases.Get(context.Background(), "doomed"); err != nil || rec.Generation == 0 {
		t.Fatalf("lease before the delete: %+v, %v", rec, err)
	}
	if _, err := r.h.Delete("doomed"); err != nil {
		t.Fatal(err)
	}
	if rec, err := r.h.cfg.Leases.Get(context.Background(), "doomed"); err != nil || rec.Generation != 0 {
		t.Errorf("lease after the delete: %+v, %v; want none", rec, err)
	}
}
