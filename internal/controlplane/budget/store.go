package budget

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
)

// reserveTx is talkide_budget_reserve in Go, for SQLite: budget rows are
// written only on the writer's connection, by whoever holds Service.conn,
// in a BEGIN IMMEDIATE transaction, so the check and the reservation cannot
// interleave with another call's.
func (s *Service) reserveTx(ctx context.Context, tx querier, r *reserveArgs) error {
	c, db := r.call, s.db
	now := controlstore.Millis(r.now)
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE((SELECT limit_nano FROM budget_limits WHERE user_id = ?),
		(SELECT limit_nano FROM budget_tenant_limits WHERE tenant = ?), ?)`, c.UserID, c.Tenant, s.cfg.DefaultLimit).Scan(&r.limit); err != nil {
		return fmt.Errorf("reserve budget: read limit: %w", err)
	}
	var spent, reserved NanoUSD
	err := tx.QueryRowContext(ctx, `SELECT spent_nano, reserved_nano FROM budget_usage WHERE user_id = ? AND period = ?`, c.UserID, r.period).Scan(&spent, &reserved)
	if errors.Is(err, sql.ErrNoRows) {
		_, err = tx.ExecContext(ctx, `INSERT INTO budget_usage (user_id, period) VALUES (?, ?)`, c.UserID, r.period)
	}
	if err != nil {
		return fmt.Errorf("reserve budget: read usage: %w", err)
	}
	r.committed = spent + reserved
	if f := s.cfg.FairUse; f.on() {
		var n, tokens int64
		var oldest sql.NullInt64
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(COALESCE(tokens, tokens_estimate)), 0), MIN(created_at)
			FROM budget_reservations WHERE user_id = ? AND created_at > ?`, c.UserID, now-f.Window.Milliseconds()).Scan(&n, &tokens, &oldest); err != nil {
			return fmt.Errorf("reserve budget: read fair-use window: %w", err)
		}
		retry := time.Duration(oldest.Int64+f.Window.Milliseconds()-now) * time.Millisecond
		switch {
		case f.MaxRequests > 0 && n >= f.MaxRequests:
			r.outcome, r.retryAfter = "fair_use_requests", retry
			return nil
		case f.MaxTokens > 0 && tokens >= f.MaxTokens:
			r.outcome, r.retryAfter = "fair_use_tokens", retry
			return nil
		}
	}
	if r.committed+c.Amount > r.limit {
		r.outcome = "budget"
		return nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE budget_usage SET reserved_nano = reserved_nano + ? WHERE user_id = ? AND period = ?`, c.Amount, c.UserID, r.period); err != nil {
		return fmt.Errorf("reserve budget: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO budget_reservations (id, user_id, period, amount_nano, created_at, expires_at, tenant, tokens_estimate)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, r.id, c.UserID, r.period, c.Amount, now, controlstore.Millis(r.now.Add(s.cfg.ReservationTTL)), c.Tenant, c.EstimatedTokens); err != nil {
		return fmt.Errorf("reserve budget: %w", err)
	}
	if err := insertLedger(ctx, tx, db, ledgerRow{kind: "reserve", at: now, userID: c.UserID, period: r.period, reservation: r.id,
		tenant: c.Tenant, env: c.Env, conversation: c.ConversationID, model: c.Model, requestID: c.RequestID, amount: c.Amount}); err != nil {
		return err
	}
	r.outcome = "ok"
	return nil
}

// settleTx books one settlement: talkide_budget_settle on PostgreSQL, the
// same steps in Go on SQLite.
func (s *Service) settleTx(ctx context.Context, tx querier, a *settleArgs) error {
	res, d, u := a.res, a.debit, a.debit.Usage
	now := controlstore.Millis(a.now)
	cw5, cw1h := ledgerCacheWrites(u)
	tokens := u.TotalTokens()
	if s.db.Dialect == controlstore.Postgres {
		refundID := ledgerID() // ids sort by time: a refund comes before its debit
		err := tx.QueryRowContext(ctx, `SELECT talkide_budget_settle($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)`,
			res.ID, ledgerID(), refundID, res.UserID, res.Tenant, res.Env, d.ConversationID, u.Model, d.RequestID, res.Period,
			a.amount, tokens, u.InputTokens, u.OutputTokens, cw5, cw1h, u.CacheReadInputTokens, d.Outcome, now).Scan(&a.result)
		if err != nil {
			return fmt.Errorf("debit budget: %w", err)
		}
		return nil
	}
	var amount NanoUSD
	var settledAt sql.NullInt64
	period, user := res.Period, res.UserID
	err := tx.QueryRowContext(ctx, `SELECT amount_nano, settled_at, period, user_id FROM budget_reservations WHERE id = ?`, res.ID).Scan(&amount, &settledAt, &period, &user)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if _, err := tx.ExecContext(ctx, `INSERT INTO budget_reservations (id, user_id, period, amount_nano, created_at, expires_at, settled_at, tenant, tokens)
			VALUES (?, ?, ?, 0, ?, ?, ?, ?, ?)`, res.ID, user, period, now, now, now, res.Tenant, tokens); err != nil {
			return fmt.Errorf("debit budget: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO budget_usage (user_id, period, spent_nano) VALUES (?, ?, ?)
			ON CONFLICT (user_id, period) DO UPDATE SET spent_nano = budget_usage.spent_nano + excluded.spent_nano`, user, period, a.amount); err != nil {
			return fmt.Errorf("debit budget: %w", err)
		}
		a.result = "orphan"
	case err != nil:
		return fmt.Errorf("debit budget: reservation %s: %w", res.ID, err)
	case settledAt.Valid && settledAt.Int64 >= 0:
		a.result = "already"
		return nil
	default:
		release, refund := amount, NanoUSD(0)
		a.result = "settled"
		if settledAt.Valid { // expired: its worst case was charged; replace it
			release, refund = 0, amount
			a.result = "expired_settled"
		}
		if _, err := tx.ExecContext(ctx, `UPDATE budget_usage SET reserved_nano = reserved_nano - ?, spent_nano = spent_nano - ? + ? WHERE user_id = ? AND period = ?`,
			release, refund, a.amount, user, period); err != nil {
			return fmt.Errorf("debit budget: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE budget_reservations SET settled_at = ?, tokens = ? WHERE id = ?`, now, tokens, res.ID); err != nil {
			return fmt.Errorf("debit budget: %w", err)
		}
		if refund > 0 {
			if err := insertLedger(ctx, tx, s.db, ledgerRow{kind: "refund", at: now, userID: user, period: period, reservation: res.ID,
				tenant: res.Tenant, env: res.Env, conversation: d.ConversationID, model: u.Model, requestID: d.RequestID,
				amount: refund, outcome: "expired_charge_replaced"}); err != nil {
				return err
			}
		}
	}
	return insertLedger(ctx, tx, s.db, ledgerRow{kind: "debit", at: now, userID: user, period: period, reservation: res.ID,
		tenant: res.Tenant, env: res.Env, conversation: d.ConversationID, model: u.Model, requestID: d.RequestID,
		input: u.InputTokens, output: u.OutputTokens, cw5m: cw5, cw1h: cw1h, cacheRead: u.CacheReadInputTokens,
		amount: a.amount, outcome: d.Outcome})
}

// ledgerCacheWrites splits cache writes as they were priced: the 5-minute
// writes, and everything else at the 1-hour rate.
func ledgerCacheWrites(u anthropic.Usage) (cw5m, cw1h int64) {
	cw5m = max(u.CacheCreation5m, 0)
	return cw5m, max(u.CacheCreationInputTokens, cw5m+max(u.CacheCreation1h, 0)) - cw5m
}

// maxExpirePerSweep bounds the work of one sweep.
const maxExpirePerSweep = 500

// expireTx charges every reservation past its expiry in full: reserved
// becomes spent, with an "expire" ledger entry.
func (s *Service) expireTx(ctx context.Context, tx querier, a *expireArgs) error {
	db := s.db
	now := controlstore.Millis(a.now)
	rows, err := tx.QueryContext(ctx, db.Q(`SELECT id, user_id, period, amount_nano, tenant FROM budget_reservations
		WHERE settled_at IS NULL AND expires_at < ? ORDER BY expires_at LIMIT `+fmt.Sprint(maxExpirePerSweep)), now)
	if err != nil {
		return fmt.Errorf("expire reservations: %w", err)
	}
	var stale []Reservation
	for rows.Next() {
		var r Reservation
		if err := rows.Scan(&r.ID, &r.UserID, &r.Period, &r.Amount, &r.Tenant); err != nil {
			rows.Close()
			return fmt.Errorf("expire reservations: %w", err)
		}
		stale = append(stale, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("expire reservations: %w", err)
	}
	// Usage rows locked in user order, as every batch does (see byUser).
	slices.SortFunc(stale, func(a, b Reservation) int { return strings.Compare(a.UserID, b.UserID) })
	for _, r := range stale {
		res, err := tx.ExecContext(ctx, db.Q(`UPDATE budget_reservations SET settled_at = ? WHERE id = ? AND settled_at IS NULL`), -now, r.ID)
		if err != nil {
			return fmt.Errorf("expire reservations: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			continue // settled meanwhile (PostgreSQL: by another replica)
		}
		if _, err := tx.ExecContext(ctx, db.Q(`UPDATE budget_usage SET reserved_nano = reserved_nano - ?, spent_nano = spent_nano + ? WHERE user_id = ? AND period = ?`),
			r.Amount, r.Amount, r.UserID, r.Period); err != nil {
			return fmt.Errorf("expire reservations: %w", err)
		}
		if err := insertLedger(ctx, tx, db, ledgerRow{kind: "expire", at: now, userID: r.UserID, period: r.Period, reservation: r.ID,
			tenant: r.Tenant, amount: r.Amount, outcome: "never_settled"}); err != nil {
			return err
		}
		a.expired++
	}
	return nil
}

type ledgerRow struct {
	kind, userID, period, reservation, tenant, env, conversation, model, requestID, outcome string
	at                                                                                      int64
	input, output, cw5m, cw1h, cacheRead                                                    int64
	amount                                                                                  NanoUSD
}

// ledgerID returns a new ledger entry id: a UUIDv7, so ids sort by time.
func ledgerID() string { return uuid.Must(uuid.NewV7()).String() }

func insertLedger(ctx context.Context, tx querier, db *controlstore.DB, r ledgerRow) error {
	_, err := tx.ExecContext(ctx, db.Q(`INSERT INTO budget_ledger (id, created_at, kind, user_id, period, reservation_id,
		conversation_id, model, request_id, input_tokens, output_tokens, cache_write_5m, cache_write_1h, cache_read, amount_nano,
		tenant, env, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		ledgerID(), r.at, r.kind, r.userID, r.period, r.reservation, r.conversation, r.model, r.requestID,
		r.input, r.output, r.cw5m, r.cw1h, r.cacheRead, r.amount, r.tenant, r.env, r.outcome)
	if err != nil {
		return fmt.Errorf("write budget ledger: %w", err)
	}
	return nil
}
