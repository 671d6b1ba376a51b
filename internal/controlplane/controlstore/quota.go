package controlstore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ConversationCaps bound the live (not deleted) conversations of a
// tenant-env: PerUser one user's, PerTenantEnv all users'. Zero or
// negative: no cap.
type ConversationCaps struct {
	PerUser, PerTenantEnv int
}

// QuotaError is returned by CreateConversationCapped when the new
// conversation would pass a cap.
type QuotaError struct {
	// Scope is "user" or "tenant-env"; Count the live conversations there
	// and Max the cap.
	Scope      string
	Count, Max int
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("conversation quota reached: %d of %d per %s", e.Count, e.Max, e.Scope)
}

// CreateConversationCapped stores c unless it would pass caps, checked and
// inserted in one transaction that conversations of the same tenant-env
// take one at a time (SQLite: the write lock taken at BEGIN; PostgreSQL: a
// transaction-scoped advisory lock on the tenant-env), so concurrent
// creations never pass a cap together. Errors: *QuotaError, or the
// database's (a duplicate id included).
func (db *DB) CreateConversationCapped(ctx context.Context, c Conversation, caps ConversationCaps) error {
	tx, err := db.SQL.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create conversation: %w", err)
	}
	defer tx.Rollback()
	if db.Dialect == Postgres {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "talkide-conversations:"+c.Tenant+"/"+c.Env); err != nil {
			return fmt.Errorf("create conversation: %w", err)
		}
	}
	var all, mine int
	err = tx.QueryRowContext(ctx, db.Q(`SELECT COUNT(*), COALESCE(SUM(CASE WHEN user_id = ? THEN 1 ELSE 0 END), 0)
		FROM conversations WHERE tenant = ? AND env = ? AND deleted_at IS NULL`), c.UserID, c.Tenant, c.Env).Scan(&all, &mine)
	if err != nil {
		return fmt.Errorf("count conversations: %w", err)
	}
	if caps.PerUser > 0 && mine >= caps.PerUser {
		return &QuotaError{Scope: "user", Count: mine, Max: caps.PerUser}
	}
	if caps.PerTenantEnv > 0 && all >= caps.PerTenantEnv {
		return &QuotaError{Scope: "tenant-env", Count: all, Max: caps.PerTenantEnv}
	}
	if _, err := tx.ExecContext(ctx, db.Q(`INSERT INTO conversations (id, tenant, env, user_id, model, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
		c.ID, c.Tenant, c.Env, c.UserID, c.Model, Millis(c.CreatedAt)); err != nil {
		return fmt.Errorf("create conversation: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create conversation: %w", err)
	}
	return nil
}

// DeleteConversation marks conversation id deleted at time at: Conversation
// no longer finds it and it stops counting for the caps; its row stays for
// the ledger and the reports that name it. ErrNotFound when there is no
// live conversation id.
func (db *DB) DeleteConversation(ctx context.Context, id string, at time.Time) error {
	res, err := db.SQL.ExecContext(ctx, db.Q(`UPDATE conversations SET deleted_at = ? WHERE id = ? AND deleted_at IS NULL`), Millis(at), id)
	if err != nil {
		return fmt.Errorf("delete conversation: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("delete conversation: %w", err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// IsQuota reports whether err is a *QuotaError.
func IsQuota(err error) bool {
	var qe *QuotaError
	return errors.As(err, &qe)
}
