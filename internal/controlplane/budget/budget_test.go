package budget

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/pgtest"
)

// stores open a fresh, empty control-plane database per test: the
// UserBudgetService's conformance suite runs against each.
var stores = map[string]func(t testing.TB) *controlstore.DB{
	"sqlite": func(t testing.TB) *controlstore.DB {
		db, err := controlstore.OpenSQLite(t.Context(), filepath.Join(t.TempDir(), "b.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	},
	"postgres": func(t testing.TB) *controlstore.DB {
		db, err := controlstore.OpenPostgres(t.Context(), pgtest.SchemaURL(t), 70)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	},
}

// testClock is a clock a test sets (Config.Now).
type testClock struct{ t atomic.Pointer[time.Time] }

func newTestClock(t time.Time) *testClock {
	c := &testClock{}
	c.Set(t)
	return c
}

func (c *testClock) Set(t time.Time) { c.t.Store(&t) }
func (c *testClock) Now() time.Time  { return *c.t.Load() }

func newService(t *testing.T, db *controlstore.DB, cfg Config) *Service {
	t.Helper()
	s := NewService(db, cfg)
	t.Cleanup(func() { s.Close() })
	return s
}

// TestConformance runs every behaviour test of the UserBudgetService on
// SQLite and on PostgreSQL.
func TestConformance(t *testing.T) {
	tests := []struct {
		name string
		fn   func(t *testing.T, db *controlstore.DB)
	}{
		{"ConcurrentReservationsNeverOvershoot", testConcurrentNeverOvershoot},
		{"ConcurrentMixedTrafficKeepsBooksExact", testConcurrentMixed},
		{"DebitReplacesReservation", testDebitReplacesReservation},
		{"ExpiredReservationChargedThenReplaced", testExpiry},
		{"LimitResolution", testLimitResolution},
		{"FairUseRequestsAndTokens", testFairUse},
		{"PeriodRollsOver", testPeriodRollsOver},
		{"UnknownReservationStillBooked", testOrphanDebit},
		{"LedgerQuery", testLedgerQuery},
		{"CancelledCallerReservesNothing", testCancelledCaller},
		{"Closed", testClosed},
		{"PipelinedChecksNeverOvershoot", testPipelinedNeverOvershoot},
		{"PredictionRefusedByOtherReplica", testPredictionRefusedByOtherReplica},
		{"PredictionFollowsLimitChange", testPredictionFollowsLimitChange},
		{"PredictionRespectsFairUse", testPredictionRespectsFairUse},
		{"NoPrediction", testNoPrediction},
		{"PipelinedFairUseBurst", testPipelinedFairUseBurst},
		{"ViewKeepsUpWithBursts", testViewKeepsUpWithBursts},
		{"BeginCommitsAtOnce", testBeginCommitsAtOnce},
	}
	for store, open := range stores {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) { tc.fn(t, open(t)) })
			}
		})
	}
}

func call(user string, amount NanoUSD) Call {
	return Call{UserID: user, Tenant: "acme", Env: "dev", ConversationID: "c1", Model: "claude-x", RequestID: "req_" + user, Amount: amount, EstimatedTokens: 10}
}

// testConcurrentNeverOvershoot fires 64 simultaneous calls at users whose
// remaining budget covers exactly k of them, one of them never seen before,
// and checks that exactly k are admitted and the reserved total stays within
// the limit.
func testConcurrentNeverOvershoot(t *testing.T, db *controlstore.DB) {
	const perCall = 1_000_000
	s := newService(t, db, Config{DefaultLimit: 3*perCall + perCall/2}) // a brand-new user may make 3
	ctx := t.Context()
	if err := s.SetUserLimit(ctx, "known", perCall); err != nil {
		t.Fatal(err)
	}
	// "known" has history: a settled call first.
	res, err := s.PreCallCheck(ctx, call("known", perCall/2))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PostCallDebit(ctx, res, perCall/4, Debit{Outcome: "complete"}); err != nil {
		t.Fatal(err)
	}
	for user, want := range map[string]int64{"known": 0, "brand-new": 3} {
		if user == "known" {
			if err := s.SetUserLimit(ctx, user, perCall/4+perCall); err != nil { // covers exactly one more
				t.Fatal(err)
			}
			want = 1
		}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 64 {
			wg.Go(func() {
				<-start
				_, err := s.PreCallCheck(ctx, call(user, perCall))
				switch {
				case err == nil:
					admitted.Add(1)
				case !errors.Is(err, ErrDenied):
					t.Errorf("%s: got error %v, want nil or ErrDenied", user, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if got := admitted.Load(); got != want {
			t.Errorf("%s: admitted %d of 64 concurrent calls, want %d", user, got, want)
		}
		sp, err := s.Spend(ctx, user, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if sp.Spent+sp.Reserved > sp.Limit {
			t.Errorf("%s: committed %d over limit %d", user, sp.Spent+sp.Reserved, sp.Limit)
		}
		if sp.Reserved != want*perCall {
			t.Errorf("%s: reserved %d, want %d", user, sp.Reserved, want*perCall)
		}
	}
}

// testConcurrentMixed runs many goroutines that reserve and settle at random
// for one user, and checks that the books balance: nothing left reserved,
// spent equal to the sum of the debits in the ledger, never over the limit.
func testConcurrentMixed(t *testing.T, db *controlstore.DB) {
	s := newService(t, db, Config{DefaultLimit: 50_000})
	ctx := t.Context()
	var booked atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 20 {
				res, err := s.PreCallCheck(ctx, call("mixed", 1000+int64(g*10+i)))
				if errors.Is(err, ErrDenied) {
					continue
				}
				if err != nil {
					t.Errorf("reserve: %v", err)
					return
				}
				actual := res.Amount / int64(1+i%3)
				if err := s.PostCallDebit(ctx, res, actual, Debit{Outcome: "complete"}); err != nil {
					t.Errorf("debit: %v", err)
					return
				}
				booked.Add(actual)
			}
		})
	}
	wg.Wait()
	sp, err := s.Spend(ctx, "mixed", "")
	if err != nil {
		t.Fatal(err)
	}
	if sp.Reserved != 0 || sp.Spent != booked.Load() || sp.Spent > sp.Limit {
		t.Errorf("spend: got spent %d reserved %d, want spent %d (≤ %d) reserved 0", sp.Spent, sp.Reserved, booked.Load(), sp.Limit)
	}
	ledger, err := s.Ledger(ctx, LedgerQuery{UserID: "mixed", Kind: "debit"})
	if err != nil {
		t.Fatal(err)
	}
	var sum NanoUSD
	for _, e := range ledger {
		sum += e.Amount
	}
	if sum != sp.Spent {
		t.Errorf("ledger debits sum to %d, spend says %d", sum, sp.Spent)
	}
}

func testDebitReplacesReservation(t *testing.T, db *controlstore.DB) {
	s := newService(t, db, Config{DefaultLimit: 10_000})
	ctx := t.Context()
	res, err := s.PreCallCheck(ctx, call("u", 6_000))
	if err != nil {
		t.Fatal(err)
	}
	var deny *DenyError
	if _, err := s.PreCallCheck(ctx, call("u", 6_000)); !errors.As(err, &deny) {
		t.Fatalf("second reservation over the limit: got %v, want a *DenyError", err)
	}
	if deny.Limit != 10_000 || deny.Committed != 6_000 || deny.Needed != 6_000 || deny.Period != s.Period() {
		t.Errorf("deny: got %+v", deny)
	}
	u := anthropic.Usage{Model: "claude-x", InputTokens: 3, OutputTokens: 4, CacheCreationInputTokens: 10, CacheCreation5m: 6, CacheReadInputTokens: 5}
	if err := s.PostCallDebit(ctx, res, 1_500, Debit{ConversationID: "c", RequestID: "req_1", Outcome: "complete", Usage: u}); err != nil {
		t.Fatal(err)
	}
	if err := s.PostCallDebit(ctx, res, 1_500, Debit{}); err != nil {
		t.Fatal(err)
	}
	sp, err := s.Spend(ctx, "u", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if sp.Spent != 1_500 || sp.Reserved != 0 || sp.Remaining() != 8_500 {
		t.Errorf("after debit (settled twice): spent %d reserved %d remaining %d, want 1500, 0, 8500", sp.Spent, sp.Reserved, sp.Remaining())
	}
	if _, err := s.PreCallCheck(ctx, call("u", 6_000)); err != nil {
		t.Errorf("reservation within the freed budget: %v", err)
	}
	l, err := s.Ledger(ctx, LedgerQuery{UserID: "u"})
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 3 || l[0].Kind != "reserve" || l[1].Kind != "debit" || l[2].Kind != "reserve" {
		t.Fatalf("ledger: got %+v, want reserve, debit, reserve", l)
	}
	d := l[1]
	want := LedgerEntry{ID: d.ID, Time: d.Time, Kind: "debit", UserID: "u", Tenant: "acme", Env: "dev", Period: s.Period(), ReservationID: res.ID,
		ConversationID: "c", Model: "claude-x", RequestID: "req_1", InputTokens: 3, OutputTokens: 4, CacheWrite5m: 6, CacheWrite1h: 4,
		CacheRead: 5, Amount: 1_500, Outcome: "complete"}
	if d != want {
		t.Errorf("debit entry:\n got %+v\nwant %+v", d, want)
	}
	if l[0].Amount != 6_000 || l[0].ReservationID != res.ID || l[0].RequestID != "req_u" || l[0].ConversationID != "c1" {
		t.Errorf("reserve entry: got %+v", l[0])
	}
}

// testExpiry checks that a reservation never settled is charged in full when
// it expires (a debit is never lost), exactly once, and that a late
// settlement replaces that charge with the actual cost.
func testExpiry(t *testing.T, db *controlstore.DB) {
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	clock := newTestClock(start)
	s := newService(t, db, Config{DefaultLimit: 10_000, ReservationTTL: time.Minute, Now: clock.Now})
	ctx := t.Context()
	res, err := s.PreCallCheck(ctx, call("u", 9_000))
	if err != nil {
		t.Fatal(err)
	}
	lost, err := s.PreCallCheck(ctx, call("v", 2_000))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s.ExpireReservations(ctx); err != nil || n != 0 {
		t.Fatalf("expire before the TTL: got %d, %v; want 0", n, err)
	}
	clock.Set(start.Add(time.Minute + time.Second))
	if n, err := s.ExpireReservations(ctx); err != nil || n != 2 {
		t.Fatalf("expire after the TTL: got %d, %v; want 2", n, err)
	}
	if n, _ := s.ExpireReservations(ctx); n != 0 {
		t.Errorf("second sweep expired %d, want 0", n)
	}
	sp, _ := s.Spend(ctx, "u", "")
	if sp.Spent != 9_000 || sp.Reserved != 0 {
		t.Errorf("after expiry: spent %d reserved %d, want 9000 (charged in full) and 0", sp.Spent, sp.Reserved)
	}
	if _, err := s.PreCallCheck(ctx, call("u", 2_000)); !errors.Is(err, ErrDenied) {
		t.Errorf("the expired charge must still count against the limit: got %v", err)
	}
	if err := s.PostCallDebit(ctx, res, 500, Debit{Outcome: "complete"}); err != nil {
		t.Fatal(err)
	}
	sp, _ = s.Spend(ctx, "u", "")
	if sp.Spent != 500 || sp.Reserved != 0 {
		t.Errorf("after the late debit: spent %d reserved %d, want 500 and 0", sp.Spent, sp.Reserved)
	}
	kinds := ""
	l, _ := s.Ledger(ctx, LedgerQuery{UserID: "u"})
	for _, e := range l {
		kinds += fmt.Sprintf("%s:%d ", e.Kind, e.Amount)
	}
	if want := "reserve:9000 expire:9000 refund:9000 debit:500 "; kinds != want {
		t.Errorf("ledger: got %q, want %q", kinds, want)
	}
	if sp, _ := s.Spend(ctx, "v", ""); sp.Spent != lost.Amount {
		t.Errorf("never-settled call: spent %d, want its worst case %d", sp.Spent, lost.Amount)
	}
}

func testLimitResolution(t *testing.T, db *controlstore.DB) {
	s := newService(t, db, Config{DefaultLimit: 1_000})
	ctx := t.Context()
	check := func(tenant string, wantLimit NanoUSD, wantSrc LimitSource) {
		t.Helper()
		sp, err := s.Spend(ctx, "u", tenant)
		if err != nil || sp.Limit != wantLimit || sp.LimitSource != wantSrc {
			t.Errorf("tenant %q: got limit %d from %s (%v), want %d from %s", tenant, sp.Limit, sp.LimitSource, err, wantLimit, wantSrc)
		}
	}
	admits := func(tenant string, amount NanoUSD) bool {
		t.Helper()
		c := call("u", amount)
		c.Tenant = tenant
		res, err := s.PreCallCheck(ctx, c)
		if err != nil && !errors.Is(err, ErrDenied) {
			t.Fatal(err)
		}
		if err == nil {
			if err := s.PostCallDebit(ctx, res, 0, Debit{}); err != nil {
				t.Fatal(err)
			}
		}
		return err == nil
	}
	check("acme", 1_000, LimitDefault)
	if !admits("acme", 1_000) || admits("acme", 1_001) {
		t.Error("default limit not applied")
	}
	if err := s.SetTenantLimit(ctx, "acme", 5_000); err != nil {
		t.Fatal(err)
	}
	check("acme", 5_000, LimitTenant)
	check("other", 1_000, LimitDefault)
	if !admits("acme", 5_000) || admits("other", 5_000) {
		t.Error("tenant limit not applied to its tenant only")
	}
	if err := s.SetUserLimit(ctx, "u", 200); err != nil {
		t.Fatal(err)
	}
	check("acme", 200, LimitUser)
	if admits("acme", 201) || !admits("acme", 200) {
		t.Error("user limit does not override the tenant's")
	}
	if err := s.SetUserLimit(ctx, "u", 0); err != nil {
		t.Fatal(err)
	}
	if admits("acme", 1) {
		t.Error("a zero limit admitted a call")
	}
	if err := s.ClearUserLimit(ctx, "u"); err != nil {
		t.Fatal(err)
	}
	check("acme", 5_000, LimitTenant)
	if err := s.ClearTenantLimit(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	check("acme", 1_000, LimitDefault)
	for _, bad := range []NanoUSD{-1, MaxCost + 1} {
		if s.SetUserLimit(ctx, "u", bad) == nil || s.SetTenantLimit(ctx, "acme", bad) == nil {
			t.Errorf("limit %d accepted", bad)
		}
	}
}

func testFairUse(t *testing.T, db *controlstore.DB) {
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	clock := newTestClock(start)
	s := newService(t, db, Config{DefaultLimit: NanoPerUSD, FairUse: FairUse{Window: time.Minute, MaxRequests: 3, MaxTokens: 1_000}, Now: clock.Now})
	ctx := t.Context()
	at := func(d time.Duration) { clock.Set(start.Add(d)) }
	at(0)
	for i := range 3 {
		at(time.Duration(i) * 10 * time.Second)
		res, err := s.PreCallCheck(ctx, call("r", 1))
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if err := s.PostCallDebit(ctx, res, 1, Debit{Usage: anthropic.Usage{InputTokens: 5}}); err != nil {
			t.Fatal(err)
		}
	}
	at(30 * time.Second)
	var fe *FairUseError
	if _, err := s.PreCallCheck(ctx, call("r", 1)); !errors.As(err, &fe) || fe.Limit != "requests" {
		t.Fatalf("fourth call in the window: got %v, want a requests FairUseError", err)
	}
	if fe.RetryAfter != 30*time.Second {
		t.Errorf("retry after: got %s, want 30s (when the first call leaves the window)", fe.RetryAfter)
	}
	if sp, _ := s.Spend(ctx, "r", ""); sp.Reserved != 0 || sp.Spent != 3 {
		t.Errorf("a fair-use refusal reserved or booked: %+v", sp)
	}
	at(60*time.Second + time.Millisecond)
	if _, err := s.PreCallCheck(ctx, call("r", 1)); err != nil {
		t.Errorf("after the first call left the window: %v", err)
	}

	// Tokens: an open call counts its estimate, a settled one its usage.
	c := call("tok", 1)
	c.EstimatedTokens = 600
	res, err := s.PreCallCheck(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PreCallCheck(ctx, c); err != nil {
		t.Fatalf("second call at 600 of 1000 tokens: %v", err)
	}
	if _, err := s.PreCallCheck(ctx, c); !errors.As(err, &fe) || fe.Limit != "tokens" {
		t.Fatalf("third call at 1200 of 1000 tokens: got %v, want a tokens FairUseError", err)
	}
	if err := s.PostCallDebit(ctx, res, 1, Debit{Usage: anthropic.Usage{InputTokens: 100, OutputTokens: 50}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PreCallCheck(ctx, c); err != nil { // 150 + 600 < 1000
		t.Errorf("after the first call settled with 150 tokens: %v", err)
	}
}

func testPeriodRollsOver(t *testing.T, db *controlstore.DB) {
	clock := newTestClock(time.Date(2026, 11, 30, 23, 59, 0, 0, time.UTC))
	s := newService(t, db, Config{DefaultLimit: 1_000, Now: clock.Now})
	ctx := t.Context()
	res, err := s.PreCallCheck(ctx, call("u", 1_000))
	if err != nil {
		t.Fatal(err)
	}
	clock.Set(time.Date(2026, 12, 1, 0, 1, 0, 0, time.UTC))
	if _, err := s.PreCallCheck(ctx, call("u", 1_000)); err != nil {
		t.Errorf("first call of December with November spent: %v", err)
	}
	// The November call settles in December: it is booked to November.
	if err := s.PostCallDebit(ctx, res, 700, Debit{}); err != nil {
		t.Fatal(err)
	}
	nov, _ := s.SpendIn(ctx, "u", "", "2026-11")
	dec, _ := s.Spend(ctx, "u", "")
	if nov.Spent != 700 || nov.Reserved != 0 || dec.Period != "2026-12" || dec.Reserved != 1_000 {
		t.Errorf("got November %+v, December %+v", nov, dec)
	}
	for k, want := range map[PeriodKind]string{Monthly: "2026-12", Weekly: "2026-W49", Daily: "2026-12-01"} {
		if got := k.Key(time.Date(2026, 12, 1, 0, 1, 0, 0, time.UTC)); got != want {
			t.Errorf("%s key: got %q, want %q", k, got, want)
		}
	}
}

func testOrphanDebit(t *testing.T, db *controlstore.DB) {
	s := newService(t, db, Config{})
	ctx := t.Context()
	res := Reservation{ID: "never-reserved", UserID: "o", Tenant: "acme", Period: s.Period(), Amount: 10}
	for range 2 {
		if err := s.PostCallDebit(ctx, res, 42, Debit{Outcome: "complete"}); err != nil {
			t.Fatal(err)
		}
	}
	if sp, _ := s.Spend(ctx, "o", ""); sp.Spent != 42 || sp.Reserved != 0 {
		t.Errorf("got %+v, want spent 42 (booked once) reserved 0", sp)
	}
}

func testLedgerQuery(t *testing.T, db *controlstore.DB) {
	s := newService(t, db, Config{})
	ctx := t.Context()
	for i, user := range []string{"a", "b", "a"} {
		c := call(user, 10)
		c.ConversationID = fmt.Sprintf("conv-%d", i)
		res, err := s.PreCallCheck(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.PostCallDebit(ctx, res, 5, Debit{ConversationID: c.ConversationID}); err != nil {
			t.Fatal(err)
		}
	}
	count := func(q LedgerQuery) int {
		l, err := s.Ledger(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		return len(l)
	}
	for name, tc := range map[string]struct {
		q    LedgerQuery
		want int
	}{
		"all":             {LedgerQuery{}, 6},
		"user":            {LedgerQuery{UserID: "a"}, 4},
		"conversation":    {LedgerQuery{ConversationID: "conv-1"}, 2},
		"kind":            {LedgerQuery{Kind: "debit", UserID: "a"}, 2},
		"limit":           {LedgerQuery{Limit: 1}, 1},
		"until the start": {LedgerQuery{Until: time.Now().Add(-time.Hour)}, 0},
		"since":           {LedgerQuery{Since: time.Now().Add(-time.Hour)}, 6},
	} {
		if got := count(tc.q); got != tc.want {
			t.Errorf("%s: got %d entries, want %d", name, got, tc.want)
		}
	}
	l, _ := s.Ledger(ctx, LedgerQuery{})
	for i := 1; i < len(l); i++ {
		if l[i].ID <= l[i-1].ID || l[i].Time.Before(l[i-1].Time) {
			t.Errorf("ledger not in time order at %d: %+v after %+v", i, l[i], l[i-1])
		}
	}
}

func testCancelledCaller(t *testing.T, db *controlstore.DB) {
	s := newService(t, db, Config{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.PreCallCheck(ctx, call("gone", 10)); err == nil {
		t.Fatal("a cancelled caller was admitted")
	}
	if sp, _ := s.Spend(t.Context(), "gone", ""); sp.Reserved != 0 {
		t.Errorf("a cancelled caller left %d reserved", sp.Reserved)
	}
}

func testClosed(t *testing.T, db *controlstore.DB) {
	s := NewService(db, Config{})
	res, err := s.PreCallCheck(t.Context(), call("c", 10))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Close()
	if err := s.PostCallDebit(t.Context(), res, 1, Debit{}); !errors.Is(err, ErrClosed) {
		t.Errorf("debit after Close: got %v, want ErrClosed", err)
	}
}
