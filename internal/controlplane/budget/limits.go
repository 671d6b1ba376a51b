package budget

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
)

// LimitSource says where a user's limit comes from.
type LimitSource string

const (
	LimitUser    LimitSource = "user"
	LimitTenant  LimitSource = "tenant"
	LimitDefault LimitSource = "default"
)

// SetUserLimit sets userID's limit per period in nano-USD, overriding the
// tenant's and the default. It applies to calls admitted from now on.
func (s *Service) SetUserLimit(ctx context.Context, userID string, limit NanoUSD) error {
	if limit < 0 || limit > MaxCost || userID == "" {
		return fmt.Errorf("set budget limit: invalid limit %d for user %q", limit, userID)
	}
	_, err := s.db.SQL.ExecContext(ctx, s.db.Q(`INSERT INTO budget_limits (user_id, limit_nano, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (user_id) DO UPDATE SET limit_nano = excluded.limit_nano, updated_at = excluded.updated_at`),
		userID, limit, controlstore.Millis(s.now()))
	if err != nil {
		return fmt.Errorf("set budget limit: %w", err)
	}
	s.forgetViews()
	return nil
}

// ClearUserLimit removes userID's own limit (the tenant's or the default
// applies again). Removing a limit that is not set is not an error.
func (s *Service) ClearUserLimit(ctx context.Context, userID string) error {
	if _, err := s.db.SQL.ExecContext(ctx, s.db.Q(`DELETE FROM budget_limits WHERE user_id = ?`), userID); err != nil {
		return fmt.Errorf("clear budget limit: %w", err)
	}
	s.forgetViews()
	return nil
}

// SetTenantLimit sets the default limit per period, in nano-USD, of users
// calling through tenant who have no limit of their own.
func (s *Service) SetTenantLimit(ctx context.Context, tenant string, limit NanoUSD) error {
	if limit < 0 || limit > MaxCost || tenant == "" {
		return fmt.Errorf("set tenant budget limit: invalid limit %d for tenant %q", limit, tenant)
	}
	_, err := s.db.SQL.ExecContext(ctx, s.db.Q(`INSERT INTO budget_tenant_limits (tenant, limit_nano, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (tenant) DO UPDATE SET limit_nano = excluded.limit_nano, updated_at = excluded.updated_at`),
		tenant, limit, controlstore.Millis(s.now()))
	if err != nil {
		return fmt.Errorf("set tenant budget limit: %w", err)
	}
	s.forgetViews()
	return nil
}

// ClearTenantLimit removes tenant's default limit.
func (s *Service) ClearTenantLimit(ctx context.Context, tenant string) error {
	if _, err := s.db.SQL.ExecContext(ctx, s.db.Q(`DELETE FROM budget_tenant_limits WHERE tenant = ?`), tenant); err != nil {
		return fmt.Errorf("clear tenant budget limit: %w", err)
	}
	s.forgetViews()
	return nil
}

// limit returns the limit of userID calling through tenant, and its source.
func (s *Service) limit(ctx context.Context, userID, tenant string) (NanoUSD, LimitSource, error) {
	var l NanoUSD
	err := s.db.SQL.QueryRowContext(ctx, s.db.Q(`SELECT limit_nano FROM budget_limits WHERE user_id = ?`), userID).Scan(&l)
	if err == nil {
		return l, LimitUser, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return 0, "", fmt.Errorf("read budget limit: %w", err)
	}
	if tenant != "" {
		err = s.db.SQL.QueryRowContext(ctx, s.db.Q(`SELECT limit_nano FROM budget_tenant_limits WHERE tenant = ?`), tenant).Scan(&l)
		if err == nil {
			return l, LimitTenant, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return 0, "", fmt.Errorf("read tenant budget limit: %w", err)
		}
	}
	return s.cfg.DefaultLimit, LimitDefault, nil
}

// Spend is a user's position in one period. Amounts are nano-USD.
type Spend struct {
	UserID string
	Period string
	// Limit applies to calls through the tenant asked about (the default
	// or the user's own when no tenant was given).
	Limit       NanoUSD
	LimitSource LimitSource
	// Spent is booked cost (debits, and expired reservations' worst case).
	Spent NanoUSD
	// Reserved is held by calls in flight.
	Reserved NanoUSD
}

// Remaining is what the user may still commit, never negative.
func (s Spend) Remaining() NanoUSD { return max(s.Limit-s.Spent-s.Reserved, 0) }

// Spend returns userID's position in the current period, with the limit
// that applies to calls through tenant ("" for the user's own or the
// default).
func (s *Service) Spend(ctx context.Context, userID, tenant string) (Spend, error) {
	return s.SpendIn(ctx, userID, tenant, s.Period())
}

// SpendIn is Spend for a given period key (e.g. "2026-10").
func (s *Service) SpendIn(ctx context.Context, userID, tenant, period string) (Spend, error) {
	sp := Spend{UserID: userID, Period: period}
	var err error
	if sp.Limit, sp.LimitSource, err = s.limit(ctx, userID, tenant); err != nil {
		return sp, err
	}
	err = s.db.SQL.QueryRowContext(ctx, s.db.Q(`SELECT spent_nano, reserved_nano FROM budget_usage WHERE user_id = ? AND period = ?`), userID, period).
		Scan(&sp.Spent, &sp.Reserved)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return sp, fmt.Errorf("read spend: %w", err)
	}
	return sp, nil
}

// LedgerEntry is one row of the append-only budget ledger. Kind is
// "reserve" (budget held for a call: Amount is its worst case), "debit"
// (the call's actual cost), "expire" (a reservation never settled, charged
// in full) or "refund" (an expired charge replaced by a late debit). The
// period's spend is the sum of debits and expires minus refunds.
type LedgerEntry struct {
	ID             string    `json:"id"`
	Time           time.Time `json:"time"`
	Kind           string    `json:"kind"`
	UserID         string    `json:"user"`
	Tenant         string    `json:"tenant,omitempty"`
	Env            string    `json:"env,omitempty"`
	Period         string    `json:"period"`
	ReservationID  string    `json:"reservation_id"`
	ConversationID string    `json:"conversation,omitempty"`
	Model          string    `json:"model,omitempty"`
	RequestID      string    `json:"request_id,omitempty"`
	InputTokens    int64     `json:"input_tokens"`
	OutputTokens   int64     `json:"output_tokens"`
	CacheWrite5m   int64     `json:"cache_write_5m_tokens"`
	CacheWrite1h   int64     `json:"cache_write_1h_tokens"`
	CacheRead      int64     `json:"cache_read_tokens"`
	// Amount in nano-USD.
	Amount  NanoUSD `json:"amount_nano_usd"`
	Outcome string  `json:"outcome,omitempty"`
}

// LedgerQuery selects ledger entries; zero fields do not filter.
type LedgerQuery struct {
	UserID         string
	ConversationID string
	Kind           string
	// Since and Until bound the entry time (Since inclusive, Until
	// exclusive).
	Since, Until time.Time
	// Limit caps the entries returned, oldest first. Zero or above 10000
	// means 10000.
	Limit int
}

// Ledger returns the entries q selects, oldest first.
func (s *Service) Ledger(ctx context.Context, q LedgerQuery) ([]LedgerEntry, error) {
	where, args := "1 = 1", []any{}
	add := func(cond string, v any) { where += " AND " + cond; args = append(args, v) }
	if q.UserID != "" {
		add("user_id = ?", q.UserID)
	}
	if q.ConversationID != "" {
		add("conversation_id = ?", q.ConversationID)
	}
	if q.Kind != "" {
		add("kind = ?", q.Kind)
	}
	if !q.Since.IsZero() {
		add("created_at >= ?", controlstore.Millis(q.Since))
	}
	if !q.Until.IsZero() {
		add("created_at < ?", controlstore.Millis(q.Until))
	}
	if q.Limit <= 0 || q.Limit > 10000 {
		q.Limit = 10000
	}
	rows, err := s.db.SQL.QueryContext(ctx, s.db.Q(`SELECT id, created_at, kind, user_id, tenant, env, period, reservation_id,
		conversation_id, model, request_id, input_tokens, output_tokens, cache_write_5m, cache_write_1h, cache_read, amount_nano, outcome
		FROM budget_ledger WHERE `+where+` ORDER BY id LIMIT `+fmt.Sprint(q.Limit)), args...)
	if err != nil {
		return nil, fmt.Errorf("read budget ledger: %w", err)
	}
	defer rows.Close()
	var out []LedgerEntry
	for rows.Next() {
		var e LedgerEntry
		var at int64
		if err := rows.Scan(&e.ID, &at, &e.Kind, &e.UserID, &e.Tenant, &e.Env, &e.Period, &e.ReservationID, &e.ConversationID,
			&e.Model, &e.RequestID, &e.InputTokens, &e.OutputTokens, &e.CacheWrite5m, &e.CacheWrite1h, &e.CacheRead, &e.Amount, &e.Outcome); err != nil {
			return nil, fmt.Errorf("read budget ledger: %w", err)
		}
		e.Time = time.UnixMilli(at).UTC()
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read budget ledger: %w", err)
	}
	return out, nil
}
