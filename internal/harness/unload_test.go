package harness

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/devupstream"
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
