package budget

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/controlstore"
	"github.com/talkide/talkide/internal/token"
)

// ErrDenied is returned by PreCallCheck when the call could push the user
// past their limit for the period.
var ErrDenied = errors.New("budget exceeded")

// DenyError is the ErrDenied of one user and period; it says how much is
// left so the message can tell the user.
type DenyError struct {
	UserID    string
	Period    string
	Limit     NanoUSD
	Committed NanoUSD // spent + reserved
	Needed    NanoUSD // the call's worst case
}

func (e *DenyError) Error() string {
	return fmt.Sprintf("budget exceeded: user %s period %s: limit %d, committed %d, call needs up to %d nano-USD",
		e.UserID, e.Period, e.Limit, e.Committed, e.Needed)
}

func (e *DenyError) Unwrap() error { return ErrDenied }

// Config configures a Service.
type Config struct {
	// DefaultLimit is a user's monthly limit when no per-user limit is set,
	// in nano-USD. Zero means 100 USD.
	DefaultLimit NanoUSD
	// ReservationTTL is how long an unsettled reservation holds budget
	// before it is released. Zero means 30 minutes (longer than any stream).
	ReservationTTL time.Duration
}

// Service is the UserBudgetService.
type Service struct {
	db  *controlstore.DB
	cfg Config
	now func() time.Time
}

// NewService returns a Service over db.
func NewService(db *controlstore.DB, cfg Config) *Service {
	if cfg.DefaultLimit <= 0 {
		cfg.DefaultLimit = 100 * 1_000_000_000
	}
	if cfg.ReservationTTL <= 0 {
		cfg.ReservationTTL = 30 * time.Minute
	}
	return &Service{db: db, cfg: cfg, now: time.Now}
}

// Period returns the budget period of t: the UTC calendar month, "2026-11".
func Period(t time.Time) string { return t.UTC().Format("2006-01") }

// Reservation is budget held for one call between PreCallCheck and
// PostCallDebit.
type Reservation struct {
	ID     string
	UserID string
	Period string
	Amount NanoUSD
}

// PreCallCheck reserves estimated (the call's worst-case cost) of userID's
// budget for the current period. It returns a *DenyError (wrapping ErrDenied)
// when spent + reserved + estimated would exceed the limit; then nothing is
// reserved. The reservation is atomic: concurrent checks never admit more
// than the limit, also for a user never seen before.
func (s *Service) PreCallCheck(ctx context.Context, userID string, estimated NanoUSD) (Reservation, error) {
	if estimated < 0 || userID == "" {
		return Reservation{}, fmt.Errorf("reserve budget: invalid estimate %d for user %q", estimated, userID)
	}
	now := s.now()
	period := Period(now)
	if err := s.expire(ctx, now); err != nil {
		return Reservation{}, err
	}
	limit, err := s.limit(ctx, userID)
	if err != nil {
		return Reservation{}, err
	}
	res := Reservation{ID: token.NewID(), UserID: userID, Period: period, Amount: estimated}
	db := s.db
	tx, err := db.SQL.BeginTx(ctx, nil)
	if err != nil {
		return Reservation{}, fmt.Errorf("reserve budget: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, db.Q(`INSERT INTO budget_usage (user_id, period) VALUES (?, ?) ON CONFLICT DO NOTHING`), userID, period); err != nil {
		return Reservation{}, fmt.Errorf("reserve budget: %w", err)
	}
	r, err := tx.ExecContext(ctx, db.Q(`UPDATE budget_usage SET reserved_nano = reserved_nano + ?
		WHERE user_id = ? AND period = ? AND spent_nano + reserved_nano + ? <= ?`), estimated, userID, period, estimated, limit)
	if err != nil {
		return Reservation{}, fmt.Errorf("reserve budget: %w", err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		var committed NanoUSD
		_ = tx.QueryRowContext(ctx, db.Q(`SELECT spent_nano + reserved_nano FROM budget_usage WHERE user_id = ? AND period = ?`), userID, period).Scan(&committed)
		return Reservation{}, &DenyError{UserID: userID, Period: period, Limit: limit, Committed: committed, Needed: estimated}
	}
	if _, err := tx.ExecContext(ctx, db.Q(`INSERT INTO budget_reservations (id, user_id, period, amount_nano, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)`),
		res.ID, userID, period, estimated, controlstore.Millis(now), controlstore.Millis(now.Add(s.cfg.ReservationTTL))); err != nil {
		return Reservation{}, fmt.Errorf("reserve budget: %w", err)
	}
	if err := s.ledger(ctx, tx, now, "reserve", res, Debit{}, estimated); err != nil {
		return Reservation{}, err
	}
	if err := tx.Commit(); err != nil {
		return Reservation{}, fmt.Errorf("reserve budget: %w", err)
	}
	return res, nil
}

// Debit describes a settled call for the ledger.
type Debit struct {
	ConversationID string
	RequestID      string
	Usage          anthropic.Usage
}

// PostCallDebit settles res with the call's actual cost: the reservation is
// released and actual is added to the period's spend, with a ledger entry. A
// reservation that already expired is not released twice, but the actual
// cost is still booked. Settling the same reservation twice books nothing
// the second time.
func (s *Service) PostCallDebit(ctx context.Context, res Reservation, actual NanoUSD, d Debit) error {
	if actual < 0 {
		return fmt.Errorf("debit budget: negative amount %d", actual)
	}
	now := s.now()
	db := s.db
	tx, err := db.SQL.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("debit budget: %w", err)
	}
	defer tx.Rollback()
	var settled, amount int64
	var settledAt *int64 // NULL: open; > 0: settled by a debit; < 0: expired
	err = tx.QueryRowContext(ctx, db.Q(`SELECT amount_nano, settled_at FROM budget_reservations WHERE id = ?`), res.ID).Scan(&amount, &settledAt)
	if err != nil {
		return fmt.Errorf("debit budget: reservation %s: %w", res.ID, err)
	}
	if settledAt != nil && *settledAt >= 0 {
		return nil // settled by a debit already
	}
	release := amount
	if settledAt != nil {
		release = 0 // expired: already released
	}
	settled = controlstore.Millis(now)
	if _, err := tx.ExecContext(ctx, db.Q(`UPDATE budget_reservations SET settled_at = ? WHERE id = ?`), settled, res.ID); err != nil {
		return fmt.Errorf("debit budget: %w", err)
	}
	if _, err := tx.ExecContext(ctx, db.Q(`UPDATE budget_usage SET reserved_nano = reserved_nano - ?, spent_nano = spent_nano + ? WHERE user_id = ? AND period = ?`),
		release, actual, res.UserID, res.Period); err != nil {
		return fmt.Errorf("debit budget: %w", err)
	}
	if err := s.ledger(ctx, tx, now, "debit", res, d, actual); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("debit budget: %w", err)
	}
	return nil
}

func (s *Service) ledger(ctx context.Context, tx *sql.Tx, now time.Time, kind string, res Reservation, d Debit, amount NanoUSD) error {
	u := d.Usage
	_, err := tx.ExecContext(ctx, s.db.Q(`INSERT INTO budget_ledger (id, created_at, kind, user_id, period, reservation_id,
		conversation_id, model, request_id, input_tokens, output_tokens, cache_write_5m, cache_write_1h, cache_read, amount_nano)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		token.NewID(), controlstore.Millis(now), kind, res.UserID, res.Period, res.ID,
		d.ConversationID, u.Model, d.RequestID, u.InputTokens, u.OutputTokens,
		u.CacheCreationInputTokens-u.CacheCreation1h, u.CacheCreation1h, u.CacheReadInputTokens, amount)
	if err != nil {
		return fmt.Errorf("write budget ledger: %w", err)
	}
	return nil
}

// limit returns userID's monthly limit: a per-user override or the default.
func (s *Service) limit(ctx context.Context, userID string) (NanoUSD, error) {
	var l NanoUSD
	err := s.db.SQL.QueryRowContext(ctx, s.db.Q(`SELECT limit_nano FROM budget_limits WHERE user_id = ?`), userID).Scan(&l)
	if errors.Is(err, sql.ErrNoRows) {
		return s.cfg.DefaultLimit, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read budget limit: %w", err)
	}
	return l, nil
}

// SetLimit sets userID's monthly limit in nano-USD.
func (s *Service) SetLimit(ctx context.Context, userID string, limit NanoUSD) error {
	if limit < 0 {
		return fmt.Errorf("set budget limit: negative limit %d", limit)
	}
	_, err := s.db.SQL.ExecContext(ctx, s.db.Q(`INSERT INTO budget_limits (user_id, limit_nano) VALUES (?, ?)
		ON CONFLICT (user_id) DO UPDATE SET limit_nano = excluded.limit_nano`), userID, limit)
	if err != nil {
		return fmt.Errorf("set budget limit: %w", err)
	}
	return nil
}

// Spend is a user's position in one period, in nano-USD.
type Spend struct {
	Period   string
	Limit    NanoUSD
	Spent    NanoUSD
	Reserved NanoUSD
}

// Spend returns userID's spend in the current period.
func (s *Service) Spend(ctx context.Context, userID string) (Spend, error) {
	sp := Spend{Period: Period(s.now())}
	l, err := s.limit(ctx, userID)
	if err != nil {
		return sp, err
	}
	sp.Limit = l
	err = s.db.SQL.QueryRowContext(ctx, s.db.Q(`SELECT spent_nano, reserved_nano FROM budget_usage WHERE user_id = ? AND period = ?`), userID, sp.Period).
		Scan(&sp.Spent, &sp.Reserved)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return sp, fmt.Errorf("read spend: %w", err)
	}
	return sp, nil
}

// expire releases reservations past their expiry: each is marked settled with
// a negative time (so a late debit books its cost without releasing twice)
// and its amount leaves reserved_nano.
func (s *Service) expire(ctx context.Context, now time.Time) error {
	db := s.db
	rows, err := db.SQL.QueryContext(ctx, db.Q(`SELECT id, user_id, period, amount_nano FROM budget_reservations WHERE settled_at IS NULL AND expires_at < ? LIMIT 100`), controlstore.Millis(now))
	if err != nil {
		return fmt.Errorf("expire reservations: %w", err)
	}
	var stale []Reservation
	for rows.Next() {
		var r Reservation
		if err := rows.Scan(&r.ID, &r.UserID, &r.Period, &r.Amount); err != nil {
			rows.Close()
			return fmt.Errorf("expire reservations: %w", err)
		}
		stale = append(stale, r)
	}
	rows.Close()
	for _, r := range stale {
		tx, err := db.SQL.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("expire reservations: %w", err)
		}
		res, err := tx.ExecContext(ctx, db.Q(`UPDATE budget_reservations SET settled_at = ? WHERE id = ? AND settled_at IS NULL`), -controlstore.Millis(now), r.ID)
		if err == nil {
			if n, _ := res.RowsAffected(); n == 1 {
				_, err = tx.ExecContext(ctx, db.Q(`UPDATE budget_usage SET reserved_nano = reserved_nano - ? WHERE user_id = ? AND period = ?`), r.Amount, r.UserID, r.Period)
				if err == nil {
					err = s.ledger(ctx, tx, now, "expire", r, Debit{}, r.Amount)
				}
			}
		}
		if err != nil {
			tx.Rollback()
			return fmt.Errorf("expire reservations: %w", err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("expire reservations: %w", err)
		}
	}
	return nil
}
