package budget

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
)

// testPipelinedNeverOvershoot fires 64 simultaneous pipelined checks
// (PreCallCheckAsync, the gateway's path) at a user seen before and at one
// never seen, whose budgets cover exactly k calls: exactly k are admitted,
// whatever was predicted, and every call admitted on a prediction is
// confirmed (this process never refuses its own earlier prediction).
func testPipelinedNeverOvershoot(t *testing.T, db *controlstore.DB) {
	const perCall = 1_000_000
	s := newService(t, db, Config{DefaultLimit: 3*perCall + perCall/2})
	ctx := t.Context()
	if _, err := s.PreCallCheck(ctx, call("warm", perCall)); err != nil { // loads "warm"'s view; 2.5 calls left
		t.Fatal(err)
	}
	for user, want := range map[string]int64{"warm": 2, "brand-new": 3} {
		var admitted, predictedRefused atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 64 {
			wg.Go(func() {
				<-start
				tk := s.PreCallCheckAsync(ctx, call(user, perCall))
				_, err := tk.Result()
				switch {
				case err == nil:
					admitted.Add(1)
				case !errors.Is(err, ErrDenied):
					t.Errorf("%s: got error %v, want nil or ErrDenied", user, err)
				case tk.Predicted:
					predictedRefused.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		if got := admitted.Load(); got != want {
			t.Errorf("%s: admitted %d of 64 concurrent calls, want %d", user, got, want)
		}
		if n := predictedRefused.Load(); n != 0 {
			t.Errorf("%s: %d calls predicted, then refused, with no other writer", user, n)
		}
		sp, err := s.Spend(ctx, user, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if sp.Spent+sp.Reserved > sp.Limit {
			t.Errorf("%s: committed %d over limit %d", user, sp.Spent+sp.Reserved, sp.Limit)
		}
	}
}

// testPredictionRefusedByOtherReplica: a replica predicts from what it last
// saw, another replica spends the user's budget meanwhile, and the
// database refuses the predicted call: the ticket was Predicted, its
// Result is a *DenyError, nothing is reserved for it, and the next call of
// the user is not predicted (it waits for the database).
func testPredictionRefusedByOtherReplica(t *testing.T, db *controlstore.DB) {
	const perCall = 1_000_000
	a := newService(t, db, Config{DefaultLimit: 100 * perCall})
	b := newService(t, db, Config{DefaultLimit: 100 * perCall})
	ctx := t.Context()
	first := a.PreCallCheckAsync(ctx, call("shared", perCall))
	if _, err := first.Result(); err != nil {
		t.Fatal(err)
	}
	if !first.Predicted {
		t.Errorf("first call with 99 calls' room: not predicted")
	}
	if _, err := b.PreCallCheck(ctx, call("shared", 98*perCall+perCall/2)); err != nil { // leaves half a call
		t.Fatal(err)
	}
	late := a.PreCallCheckAsync(ctx, call("shared", perCall))
	_, err := late.Result()
	var deny *DenyError
	if !late.Predicted || !errors.As(err, &deny) {
		t.Fatalf("call after the other replica spent: predicted %v, error %v; want predicted and a *DenyError", late.Predicted, err)
	}
	sp, err := a.Spend(ctx, "shared", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if want := NanoUSD(99*perCall + perCall/2); sp.Reserved != want || sp.Spent+sp.Reserved > sp.Limit {
		t.Errorf("reserved %d (limit %d), want %d", sp.Reserved, sp.Limit, want)
	}
	next := a.PreCallCheckAsync(ctx, call("shared", perCall/4))
	if _, err := next.Result(); err != nil {
		t.Fatalf("a call that fits: %v", err)
	}
	if next.Predicted {
		t.Errorf("call right after a refusal was predicted; want the exact path")
	}
}

// testPredictionFollowsLimitChange: lowering a user's limit takes effect on
// the very next call of this replica, predicted or not.
func testPredictionFollowsLimitChange(t *testing.T, db *controlstore.DB) {
	const perCall = 1_000_000
	s := newService(t, db, Config{DefaultLimit: 100 * perCall})
	ctx := t.Context()
	if _, err := s.PreCallCheckAsync(ctx, call("lowered", perCall)).Result(); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUserLimit(ctx, "lowered", perCall+perCall/2); err != nil {
		t.Fatal(err)
	}
	tk := s.PreCallCheckAsync(ctx, call("lowered", perCall))
	if _, err := tk.Result(); !errors.Is(err, ErrDenied) {
		t.Fatalf("call over the lowered limit: got %v, want ErrDenied", err)
	}
	if tk.Predicted {
		t.Errorf("call over the lowered limit was predicted")
	}
}

// testPredictionRespectsFairUse: calls near the fair-use limit are not
// predicted, and the limit holds exactly.
func testPredictionRespectsFairUse(t *testing.T, db *controlstore.DB) {
	s := newService(t, db, Config{DefaultLimit: 100 * NanoPerUSD, FairUse: FairUse{Window: time.Hour, MaxRequests: 8}})
	ctx := t.Context()
	var admitted, predicted int
	for range 12 {
		tk := s.PreCallCheckAsync(ctx, call("busy", 1000))
		if tk.Predicted {
			predicted++
		}
		_, err := tk.Result()
		switch {
		case err == nil:
			admitted++
		case !errors.Is(err, ErrFairUse):
			t.Fatalf("got %v, want nil or ErrFairUse", err)
		case tk.Predicted:
			t.Errorf("call %d predicted, then refused for fair use", admitted+1)
		}
	}
	if admitted != 8 {
		t.Errorf("admitted %d calls, want the fair-use limit, 8", admitted)
	}
	if predicted == 0 || predicted > 6 {
		t.Errorf("%d calls predicted; want some, and none of the last quarter before the limit", predicted)
	}
}

// testNoPrediction: with NoPrediction every check has ended, durably,
// before PreCallCheckAsync returns.
func testNoPrediction(t *testing.T, db *controlstore.DB) {
	s := newService(t, db, Config{DefaultLimit: 100 * NanoPerUSD, NoPrediction: true})
	for i := range 3 {
		tk := s.PreCallCheckAsync(t.Context(), call("strict", 1000))
		select {
		case <-tk.Done():
		default:
			t.Fatalf("call %d: ticket still committing", i)
		}
		if _, err := tk.Result(); err != nil || tk.Predicted {
			t.Fatalf("call %d: predicted %v, error %v; want a durable reservation, not predicted", i, tk.Predicted, err)
		}
	}
	sp, err := s.Spend(t.Context(), "strict", "acme")
	if err != nil || sp.Reserved != 3000 {
		t.Errorf("reserved %d (%v), want 3000", sp.Reserved, err)
	}
}

// testPipelinedFairUseBurst: a burst of simultaneous calls at a fair-use
// limit is never predicted past it (calls still committing count).
func testPipelinedFairUseBurst(t *testing.T, db *controlstore.DB) {
	s := newService(t, db, Config{DefaultLimit: 100 * NanoPerUSD, FairUse: FairUse{Window: time.Hour, MaxRequests: 8}})
	ctx := t.Context()
	if _, err := s.PreCallCheck(ctx, call("burst", 1000)); err != nil {
		t.Fatal(err)
	}
	var admitted, predictedRefused atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 32 {
		wg.Go(func() {
			<-start
			tk := s.PreCallCheckAsync(ctx, call("burst", 1000))
			_, err := tk.Result()
			switch {
			case err == nil:
				admitted.Add(1)
			case tk.Predicted:
				predictedRefused.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if n := admitted.Load(); n != 7 {
		t.Errorf("admitted %d, want the 7 left of the fair-use limit", n)
	}
	if n := predictedRefused.Load(); n != 0 {
		t.Errorf("%d calls predicted, then refused by this process's own fair-use count", n)
	}
}

// testViewKeepsUpWithBursts: after bursts of simultaneous calls the view
// never counts less committed spend than the database holds (answers are
// applied in commit order), and a call that fits into what the view
// believes is left is never refused by this process's own spending.
func testViewKeepsUpWithBursts(t *testing.T, db *controlstore.DB) {
	const unit = 1_000_000
	s := newService(t, db, Config{DefaultLimit: 80 * unit})
	ctx := t.Context()
	for round := range 8 {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 8 {
			wg.Go(func() {
				<-start
				s.PreCallCheckAsync(ctx, call("bursty", unit)).Result()
			})
		}
		close(start)
		wg.Wait()
		sp, err := s.Spend(ctx, "bursty", "acme")
		if err != nil {
			t.Fatal(err)
		}
		v, _ := s.views.Load(userKey{"bursty", s.Period()})
		uv := v.(*userView)
		uv.mu.Lock()
		seen, unanswered := uv.committed, uv.unanswered
		uv.mu.Unlock()
		if seen < sp.Spent+sp.Reserved || unanswered != 0 {
			t.Fatalf("round %d: view holds %d committed and %d unanswered; the database %d", round, seen, unanswered, sp.Spent+sp.Reserved)
		}
	}
	// 64 of 80 units committed: a call of 7 fits twice into what is left
	// and is predicted; it must be admitted.
	tk := s.PreCallCheckAsync(ctx, call("bursty", 7*unit))
	if _, err := tk.Result(); err != nil || !tk.Predicted {
		t.Errorf("call that fits: predicted %v, error %v; want predicted and admitted", tk.Predicted, err)
	}
}

// testBeginCommitsAtOnce: Begin starts a predicted reservation's commit
// without waiting for the commit delay (the gateway calls it when the
// upstream's answer is in).
func testBeginCommitsAtOnce(t *testing.T, db *controlstore.DB) {
	s := newService(t, db, Config{DefaultLimit: 100 * NanoPerUSD, CommitDelay: time.Hour})
	tk := s.PreCallCheckAsync(t.Context(), call("eager", 1000))
	if !tk.Predicted {
		t.Fatal("not predicted")
	}
	tk.Begin()
	tk.Begin() // a second call changes nothing
	select {
	case <-tk.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("reservation still waiting for its commit delay after Begin")
	}
	if _, err := tk.Result(); err != nil {
		t.Fatal(err)
	}
	sp, err := s.Spend(t.Context(), "eager", "acme")
	if err != nil || sp.Reserved != 1000 {
		t.Errorf("reserved %d (%v), want 1000", sp.Reserved, err)
	}
}
