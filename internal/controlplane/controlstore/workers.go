package controlstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"time"
)

// Desired states of a worker record.
const (
	WorkerPresent = "present"
	WorkerAbsent  = "absent"
)

// WorkerRecord is the operator's request for one tenant-env's worker: the
// K8sWorkerProvisioner's desired state. It says nothing about what exists;
// that is read from the cluster.
type WorkerRecord struct {
	Tenant, Env string
	// Desired is WorkerPresent or WorkerAbsent.
	Desired string
	// Generation grows with every SetWorkerDesired.
	Generation int64
	// LastError is the last reconcile's failure for this generation, "" when
	// it succeeded.
	LastError string
	// IdentityJTI is the id of the identity token last written to the
	// worker's Secret ("" before the first).
	IdentityJTI string
	UpdatedAt   time.Time
}

// SetWorkerDesired records that the tenant-env's worker should be present
// or absent and returns the record's new generation.
func (db *DB) SetWorkerDesired(ctx context.Context, tenant, env, desired string, at time.Time) (int64, error) {
	if desired != WorkerPresent && desired != WorkerAbsent {
		return 0, fmt.Errorf("set worker desired state: %q is neither %q nor %q", desired, WorkerPresent, WorkerAbsent)
	}
	var gen int64
	err := db.SQL.QueryRowContext(ctx, db.Q(`INSERT INTO workers (tenant, env, desired, generation, last_error, updated_at) VALUES (?, ?, ?, 1, '', ?)
		ON CONFLICT (tenant, env) DO UPDATE SET desired = excluded.desired, generation = workers.generation + 1, last_error = '', updated_at = excluded.updated_at
		RETURNING generation`), tenant, env, desired, Millis(at)).Scan(&gen)
	if err != nil {
		return 0, fmt.Errorf("set worker desired state: %w", err)
	}
	return gen, nil
}

// WorkerRecord returns the tenant-env's record, or ErrNotFound.
func (db *DB) WorkerRecord(ctx context.Context, tenant, env string) (WorkerRecord, error) {
	rows, err := db.workerRecords(ctx, `WHERE tenant = ? AND env = ?`, tenant, env)
	if err != nil {
		return WorkerRecord{}, err
	}
	if len(rows) == 0 {
		return WorkerRecord{}, ErrNotFound
	}
	return rows[0], nil
}

// WorkerRecords returns every record, ordered by tenant and env.
func (db *DB) WorkerRecords(ctx context.Context) ([]WorkerRecord, error) {
	return db.workerRecords(ctx, ``)
}

func (db *DB) workerRecords(ctx context.Context, where string, args ...any) ([]WorkerRecord, error) {
	rows, err := db.SQL.QueryContext(ctx, db.Q(`SELECT tenant, env, desired, generation, last_error, identity_jti, updated_at FROM workers `+where+` ORDER BY tenant, env`), args...)
	if err != nil {
		return nil, fmt.Errorf("read worker records: %w", err)
	}
	defer rows.Close()
	var out []WorkerRecord
	for rows.Next() {
		var r WorkerRecord
		var at int64
		if err := rows.Scan(&r.Tenant, &r.Env, &r.Desired, &r.Generation, &r.LastError, &r.IdentityJTI, &at); err != nil {
			return nil, fmt.Errorf("read worker records: %w", err)
		}
		r.UpdatedAt = time.UnixMilli(at).UTC()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read worker records: %w", err)
	}
	return out, nil
}

// SetWorkerError records the outcome of a reconcile of generation gen
// ("" for success). A record of another generation is left alone: the
// reconcile was overtaken. ErrNotFound then.
func (db *DB) SetWorkerError(ctx context.Context, tenant, env string, gen int64, msg string) error {
	res, err := db.SQL.ExecContext(ctx, db.Q(`UPDATE workers SET last_error = ? WHERE tenant = ? AND env = ? AND generation = ?`), msg, tenant, env, gen)
	if err != nil {
		return fmt.Errorf("record worker error: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// DeleteWorkerRecord removes the record once a deprovision of generation
// gen is complete. ErrNotFound when the record is of another generation or
// not absent (a provision came since).
func (db *DB) DeleteWorkerRecord(ctx context.Context, tenant, env string, gen int64) error {
	res, err := db.SQL.ExecContext(ctx, db.Q(`DELETE FROM workers WHERE tenant = ? AND env = ? AND generation = ? AND desired = ?`), tenant, env, gen, WorkerAbsent)
	if err != nil {
		return fmt.Errorf("delete worker record: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// LiveIdentityTokens returns the tenant-env's identity tokens that are not
// revoked (expired ones included), oldest first.
func (db *DB) LiveIdentityTokens(ctx context.Context, tenant, env string) ([]IdentityToken, error) {
	rows, err := db.SQL.QueryContext(ctx, db.Q(`SELECT jti, tenant, env, issued_at, expires_at, retire_at FROM identity_tokens
		WHERE tenant = ? AND env = ? AND revoked_at IS NULL ORDER BY issued_at, jti`), tenant, env)
	if err != nil {
		return nil, fmt.Errorf("read identity tokens: %w", err)
	}
	defer rows.Close()
	var out []IdentityToken
	for rows.Next() {
		var t IdentityToken
		var issued, expires int64
		var retire sql.NullInt64
		if err := rows.Scan(&t.JTI, &t.Tenant, &t.Env, &issued, &expires, &retire); err != nil {
			return nil, fmt.Errorf("read identity tokens: %w", err)
		}
		t.IssuedAt, t.ExpiresAt = time.UnixMilli(issued).UTC(), time.UnixMilli(expires).UTC()
		if retire.Valid {
			r := time.UnixMilli(retire.Int64).UTC()
			t.RetireAt = &r
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read identity tokens: %w", err)
	}
	return out, nil
}

// RetireIdentityToken gives an unrevoked identity token its end of grace:
// it stays valid until at, then is to be revoked. A token that already has
// one keeps the earlier. ErrNotFound for an unknown or revoked token.
func (db *DB) RetireIdentityToken(ctx context.Context, jti string, at time.Time) error {
	res, err := db.SQL.ExecContext(ctx, db.Q(`UPDATE identity_tokens SET retire_at = CASE WHEN retire_at IS NULL OR retire_at > ? THEN ? ELSE retire_at END
		WHERE jti = ? AND revoked_at IS NULL`), Millis(at), Millis(at), jti)
	if err != nil {
		return fmt.Errorf("retire identity token: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// SetWorkerIdentity records that the tenant-env's Secret now holds identity
// token jti. ErrNotFound when there is no record.
func (db *DB) SetWorkerIdentity(ctx context.Context, tenant, env, jti string) error {
	res, err := db.SQL.ExecContext(ctx, db.Q(`UPDATE workers SET identity_jti = ? WHERE tenant = ? AND env = ?`), jti, tenant, env)
	if err != nil {
		return fmt.Errorf("record worker identity: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// InstallationID returns this database's installation id, made (random,
// 16 hex digits) on first use.
func (db *DB) InstallationID(ctx context.Context) (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	if _, err := db.SQL.ExecContext(ctx, db.Q(`INSERT INTO installation (name, value) VALUES ('installation_id', ?) ON CONFLICT (name) DO NOTHING`), hex.EncodeToString(b)); err != nil {
		return "", fmt.Errorf("installation id: %w", err)
	}
	var id string
	if err := db.SQL.QueryRowContext(ctx, db.Q(`SELECT value FROM installation WHERE name = 'installation_id'`)).Scan(&id); err != nil {
		return "", fmt.Errorf("installation id: %w", err)
	}
	return id, nil
}

// ClaimConfigRevision records that a control plane of configuration
// revision rev (TALKIDE_CONFIG_REVISION: the Helm release revision the
// chart gives each rollout) runs at now and gives way once unseen for
// staleAfter, unless one of a higher revision is in charge: seen within its
// own staleAfter. It returns the revision then in charge: rev, or the
// higher one. Control planes of an older revision leave the workers to the
// one in charge (provision.Config.ConfigRevision); a revision no longer
// seen (its release uninstalled, its rollout undone) gives way to any
// other. Errors are the database's.
func (db *DB) ClaimConfigRevision(ctx context.Context, rev int64, now time.Time, staleAfter time.Duration) (int64, error) {
	if _, err := db.SQL.ExecContext(ctx, db.Q(`INSERT INTO config_revision (id, revision, seen_at, stale_ms) VALUES (1, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET revision = excluded.revision, seen_at = excluded.seen_at, stale_ms = excluded.stale_ms
		WHERE config_revision.revision <= excluded.revision OR config_revision.seen_at + config_revision.stale_ms < excluded.seen_at`),
		rev, now.UnixMilli(), staleAfter.Milliseconds()); err != nil {
		return 0, fmt.Errorf("record configuration revision: %w", err)
	}
	cur, _, err := db.ConfigRevision(ctx, now)
	return cur, err
}

// ConfigRevision returns the configuration revision in charge (see
// ClaimConfigRevision), 0 when none was ever claimed, and whether it was
// seen within its staleness window at now.
func (db *DB) ConfigRevision(ctx context.Context, now time.Time) (rev int64, live bool, err error) {
	var seen, stale int64
	err = db.SQL.QueryRowContext(ctx, db.Q(`SELECT revision, seen_at, stale_ms FROM config_revision WHERE id = 1`)).Scan(&rev, &seen, &stale)
	if err == sql.ErrNoRows {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("configuration revision: %w", err)
	}
	return rev, seen+stale >= now.UnixMilli(), nil
}
