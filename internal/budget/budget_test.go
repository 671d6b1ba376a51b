package budget

import (
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/controlstore"
)

func newService(t *testing.T, limit NanoUSD) *Service {
	t.Helper()
	db, err := controlstore.OpenSQLite(t.Context(), filepath.Join(t.TempDir(), "b.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return NewService(db, Config{DefaultLimit: limit})
}

// TestConcurrentReservationsNeverOvershoot fires many calls at users whose
// budget covers exactly one, including a user never seen before.
func TestConcurrentReservationsNeverOvershoot(t *testing.T) {
	const perCall = 1_000
	s := newService(t, 10*perCall)
	if err := s.SetLimit(t.Context(), "known", perCall); err != nil {
		t.Fatal(err)
	}
	for _, user := range []string{"known", "brand-new"} {
		if user == "brand-new" {
			if err := s.SetLimit(t.Context(), user, perCall); err != nil {
				t.Fatal(err)
			}
		}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for i := 0; i < 32; i++ {
			wg.Go(func() {
				_, err := s.PreCallCheck(t.Context(), user, perCall)
				switch {
				case err == nil:
					admitted.Add(1)
				case !errors.Is(err, ErrDenied):
					t.Errorf("%s: unexpected error %v", user, err)
				}
			})
		}
		wg.Wait()
		if got := admitted.Load(); got != 1 {
			t.Errorf("%s: admitted %d calls, want 1", user, got)
		}
	}
}

func TestDebitReplacesReservation(t *testing.T) {
	s := newService(t, 10_000)
	ctx := t.Context()
	res, err := s.PreCallCheck(ctx, "u", 6_000)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PreCallCheck(ctx, "u", 6_000); !errors.Is(err, ErrDenied) {
		t.Fatalf("second reservation over the limit: got %v, want ErrDenied", err)
	}
	if err := s.PostCallDebit(ctx, res, 1_500, Debit{ConversationID: "c", RequestID: "req_1", Usage: anthropic.Usage{Model: "m", InputTokens: 3}}); err != nil {
		t.Fatal(err)
	}
	if err := s.PostCallDebit(ctx, res, 1_500, Debit{}); err != nil {
		t.Fatal(err)
	}
	sp, err := s.Spend(ctx, "u")
	if err != nil {
		t.Fatal(err)
	}
	if sp.Spent != 1_500 || sp.Reserved != 0 {
		t.Errorf("after debit (settled twice): spent %d reserved %d, want 1500 and 0", sp.Spent, sp.Reserved)
	}
	if _, err := s.PreCallCheck(ctx, "u", 6_000); err != nil {
		t.Errorf("reservation within the freed budget: %v", err)
	}
	var n int
	s.db.SQL.QueryRow(`SELECT COUNT(*) FROM budget_ledger WHERE user_id = 'u'`).Scan(&n)
	if n != 3 {
		t.Errorf("ledger rows: got %d, want 3 (reserve, debit, reserve)", n)
	}
}

func TestExpiredReservationReleasedOnce(t *testing.T) {
	s := newService(t, 10_000)
	ctx := t.Context()
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s.now = func() time.Time { return start }
	res, err := s.PreCallCheck(ctx, "u", 9_000)
	if err != nil {
		t.Fatal(err)
	}
	s.now = func() time.Time { return start.Add(s.cfg.ReservationTTL + time.Second) }
	if _, err := s.PreCallCheck(ctx, "u", 9_000); err != nil {
		t.Fatalf("after expiry the budget must be free: %v", err)
	}
	// The late debit of the expired call still books its cost, without
	// releasing its reservation a second time.
	if err := s.PostCallDebit(ctx, res, 500, Debit{}); err != nil {
		t.Fatal(err)
	}
	sp, _ := s.Spend(ctx, "u")
	if sp.Spent != 500 || sp.Reserved != 9_000 {
		t.Errorf("got spent %d reserved %d, want 500 and 9000", sp.Spent, sp.Reserved)
	}
}

func TestPriceCost(t *testing.T) {
	p := DefaultPrices()
	opus, ok := p.Lookup("claude-opus-5-5-20261001")
	if !ok {
		t.Fatal("claude-opus-5-5 not priced")
	}
	cases := []struct {
		name string
		u    anthropic.Usage
		want NanoUSD
	}{
		// 1M input at $4 + 1M output at $20 = $24.
		{"plain", anthropic.Usage{InputTokens: 1_000_000, OutputTokens: 1_000_000}, 24_000_000_000},
		// cache read 1M at $0.20, writes 1M 5m at $5 and 1M 1h at $8.
		{"cache read and both writes", anthropic.Usage{CacheReadInputTokens: 1_000_000, CacheCreationInputTokens: 2_000_000, CacheCreation5m: 1_000_000, CacheCreation1h: 1_000_000}, 13_200_000_000},
		// writes without a TTL split are priced at the 1h rate.
		{"write without split", anthropic.Usage{CacheCreationInputTokens: 1_000_000}, 8_000_000_000},
		// one token rounds up to a whole nano-USD.
		{"rounding", anthropic.Usage{InputTokens: 1}, 4_000},
	}
	for _, tc := range cases {
		if got := opus.Cost(tc.u); got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, got, tc.want)
		}
	}
	if _, known := p.PriceFor("my-custom-model"); known {
		t.Error("unknown model reported as known")
	}
	if d, _ := p.PriceFor("my-custom-model"); d.Output < opus.Output {
		t.Errorf("unknown model priced below a known one: %d < %d", d.Output, opus.Output)
	}
}
