// Package controlstore is the control plane's database: users and their
// grants, conversations, issued identity tokens, and the tables the
// UserBudgetService keeps. It runs on SQLite (modernc.org/sqlite, pure Go;
// the embedded default; OpenSQLite) and PostgreSQL (pgx's database/sql
// driver; OpenPostgres, selected by TALKIDE_DATABASE_URL), with the same
// portable SQL migrations applied by goose at open, plus the budget's
// PL/pgSQL functions on PostgreSQL (pgsql/, a Go migration that is a no-op
// on SQLite). The tests run as one conformance suite on both.
//
// Main types: DB (an open database with its dialect) and the record types
// User, Conversation, IdentityToken. It does not hash tokens or decide
// access; callers do.
package controlstore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pressly/goose/v3"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

//go:embed migrations/*.sql
var migrations embed.FS

// Dialect is the SQL dialect of a DB.
type Dialect string

const (
	SQLite   Dialect = "sqlite"
	Postgres Dialect = "postgres"
)

// DB is the control-plane database.
type DB struct {
	SQL     *sql.DB
	Dialect Dialect
	// Path is the SQLite database file ("" on PostgreSQL).
	Path string
}

// ErrNotFound is returned when a record does not exist.
var ErrNotFound = errors.New("not found")

// ErrExists is returned by CreateUser when the user already exists.
var ErrExists = errors.New("already exists")

// OpenSQLite opens (creating if needed) the SQLite database at path and
// migrates it. WAL mode and a busy timeout let several goroutines share it;
// write transactions take the lock at BEGIN (immediate), which makes
// check-then-update sequences atomic.
func OpenSQLite(ctx context.Context, path string) (*DB, error) {
	// The file holds user token hashes and the ledger: create it (and its
	// directory) private; SQLite's -wal and -shm files take its mode.
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o600); err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	} else {
		f.Close()
	}
	dsn := "file:" + path + "?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_pragma=synchronous(FULL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	// Keep the connections of concurrent readers (database/sql keeps 2 by
	// default): opening one costs more than the query it serves.
	db.SetMaxIdleConns(16)
	d, err := migrate(ctx, db, SQLite)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	d.Path = path
	return d, nil
}

func migrate(ctx context.Context, db *sql.DB, d Dialect) (*DB, error) {
	gd := goose.DialectSQLite3
	if d == Postgres {
		gd = goose.DialectPostgres
	}
	p, err := goose.NewProvider(gd, db, mustSub(migrations, "migrations"),
		goose.WithDisableGlobalRegistry(true), goose.WithGoMigrations(goMigrations(d)...))
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	unlock := func() {}
	if d == Postgres {
		if unlock, err = lockMigrations(ctx, db); err != nil {
			db.Close()
			return nil, err
		}
	}
	_, err = p.Up(ctx)
	unlock()
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return &DB{SQL: db, Dialect: d}, nil
}

// lockMigrations takes a PostgreSQL advisory lock keyed by the current
// schema, so control-plane replicas starting together migrate one at a
// time (and tests in separate schemas do not wait for each other). The
// returned func releases it.
func lockMigrations(ctx context.Context, db *sql.DB) (func(), error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: lock: %w", err)
	}
	const key = `hashtext('talkide-migrate:' || current_schema())`
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock(`+key+`)`); err != nil {
		conn.Close()
		return nil, fmt.Errorf("migrate: lock: %w", err)
	}
	return func() {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(`+key+`)`)
		conn.Close()
	}, nil
}

// Close closes the database.
func (db *DB) Close() error { return db.SQL.Close() }

// Q rewrites a query written with '?' placeholders for the dialect ($1, $2,
// ... on PostgreSQL).
func (db *DB) Q(query string) string {
	if db.Dialect != Postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Millis converts a time to the stored Unix milliseconds.
func Millis(t time.Time) int64 { return t.UnixMilli() }

// User is a platform user of the browser API.
type User struct {
	ID string
	// TokenHash is the hex SHA-256 of the user's bearer token.
	TokenHash string
}

// UpsertUser creates the user or replaces its token hash, and grants it the
// given tenant-envs ("tenant/env").
func (db *DB) UpsertUser(ctx context.Context, u User, grants ...[2]string) error {
	tx, err := db.SQL.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("upsert user: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, db.Q(`INSERT INTO users (id, token_hash, created_at) VALUES (?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET token_hash = excluded.token_hash`), u.ID, u.TokenHash, Millis(time.Now())); err != nil {
		return fmt.Errorf("upsert user: %w", err)
	}
	for _, g := range grants {
		if _, err := tx.ExecContext(ctx, db.Q(`INSERT INTO grants (user_id, tenant, env) VALUES (?, ?, ?) ON CONFLICT DO NOTHING`), u.ID, g[0], g[1]); err != nil {
			return fmt.Errorf("upsert user grant: %w", err)
		}
	}
	return tx.Commit()
}

// CreateUser creates the user with the given tenant-env grants, or returns
// ErrExists (and changes nothing) when a user of that id exists: unlike
// UpsertUser it never replaces someone's token.
func (db *DB) CreateUser(ctx context.Context, u User, grants ...[2]string) error {
	tx, err := db.SQL.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create user: %w", err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, db.Q(`INSERT INTO users (id, token_hash, created_at) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING`),
		u.ID, u.TokenHash, Millis(time.Now()))
	if err != nil {
		return fmt.Errorf("create user: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("create user: %w", err)
	} else if n == 0 {
		return fmt.Errorf("create user %s: %w", u.ID, ErrExists)
	}
	for _, g := range grants {
		if _, err := tx.ExecContext(ctx, db.Q(`INSERT INTO grants (user_id, tenant, env) VALUES (?, ?, ?) ON CONFLICT DO NOTHING`), u.ID, g[0], g[1]); err != nil {
			return fmt.Errorf("create user grant: %w", err)
		}
	}
	return tx.Commit()
}

// UserByTokenHash returns the user whose token hashes to hash, or ErrNotFound.
func (db *DB) UserByTokenHash(ctx context.Context, hash string) (User, error) {
	var u User
	err := db.SQL.QueryRowContext(ctx, db.Q(`SELECT id, token_hash FROM users WHERE token_hash = ?`), hash).Scan(&u.ID, &u.TokenHash)
	if errors.Is(err, sql.ErrNoRows) {
		return User{}, ErrNotFound
	}
	if err != nil {
		return User{}, fmt.Errorf("look up user: %w", err)
	}
	return u, nil
}

// HasGrant reports whether the user may use the tenant-env.
func (db *DB) HasGrant(ctx context.Context, userID, tenant, env string) (bool, error) {
	var n int
	err := db.SQL.QueryRowContext(ctx, db.Q(`SELECT COUNT(*) FROM grants WHERE user_id = ? AND tenant = ? AND env = ?`), userID, tenant, env).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("check grant: %w", err)
	}
	return n > 0, nil
}

// Conversation is a conversation of a user in a tenant-env.
type Conversation struct {
	ID     string
	Tenant string
	Env    string
	UserID string
	// Model is the model chosen at creation ("" for the worker's default).
	Model     string
	CreatedAt time.Time
}

// CreateConversation stores a new conversation.
func (db *DB) CreateConversation(ctx context.Context, c Conversation) error {
	_, err := db.SQL.ExecContext(ctx, db.Q(`INSERT INTO conversations (id, tenant, env, user_id, model, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
		c.ID, c.Tenant, c.Env, c.UserID, c.Model, Millis(c.CreatedAt))
	if err != nil {
		return fmt.Errorf("create conversation: %w", err)
	}
	return nil
}

// Conversation returns the conversation id, or ErrNotFound (also for a
// deleted one).
func (db *DB) Conversation(ctx context.Context, id string) (Conversation, error) {
	var c Conversation
	var created int64
	err := db.SQL.QueryRowContext(ctx, db.Q(`SELECT id, tenant, env, user_id, model, created_at FROM conversations WHERE id = ? AND deleted_at IS NULL`), id).
		Scan(&c.ID, &c.Tenant, &c.Env, &c.UserID, &c.Model, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return Conversation{}, ErrNotFound
	}
	if err != nil {
		return Conversation{}, fmt.Errorf("look up conversation: %w", err)
	}
	c.CreatedAt = time.UnixMilli(created).UTC()
	return c, nil
}

// IdentityToken records an issued identity token (never the token itself).
type IdentityToken struct {
	JTI       string
	Tenant    string
	Env       string
	IssuedAt  time.Time
	ExpiresAt time.Time
	RevokedAt *time.Time
	// RetireAt, when set, ends the token's grace after a rotation: the
	// mint refuses it from then on, and the provisioner revokes it.
	RetireAt *time.Time
}

// RecordIdentityToken stores an issued identity token's id.
func (db *DB) RecordIdentityToken(ctx context.Context, t IdentityToken) error {
	_, err := db.SQL.ExecContext(ctx, db.Q(`INSERT INTO identity_tokens (jti, tenant, env, issued_at, expires_at) VALUES (?, ?, ?, ?, ?)`),
		t.JTI, t.Tenant, t.Env, Millis(t.IssuedAt), Millis(t.ExpiresAt))
	if err != nil {
		return fmt.Errorf("record identity token: %w", err)
	}
	return nil
}

// IdentityTokenByID returns a recorded identity token, or ErrNotFound.
func (db *DB) IdentityTokenByID(ctx context.Context, jti string) (IdentityToken, error) {
	var t IdentityToken
	var issued, expires int64
	var revoked, retire sql.NullInt64
	err := db.SQL.QueryRowContext(ctx, db.Q(`SELECT jti, tenant, env, issued_at, expires_at, revoked_at, retire_at FROM identity_tokens WHERE jti = ?`), jti).
		Scan(&t.JTI, &t.Tenant, &t.Env, &issued, &expires, &revoked, &retire)
	if errors.Is(err, sql.ErrNoRows) {
		return IdentityToken{}, ErrNotFound
	}
	if err != nil {
		return IdentityToken{}, fmt.Errorf("look up identity token: %w", err)
	}
	t.IssuedAt, t.ExpiresAt = time.UnixMilli(issued).UTC(), time.UnixMilli(expires).UTC()
	if revoked.Valid {
		r := time.UnixMilli(revoked.Int64).UTC()
		t.RevokedAt = &r
	}
	if retire.Valid {
		r := time.UnixMilli(retire.Int64).UTC()
		t.RetireAt = &r
	}
	return t, nil
}

// RevokeIdentityToken marks a recorded identity token revoked.
func (db *DB) RevokeIdentityToken(ctx context.Context, jti string, at time.Time) error {
	res, err := db.SQL.ExecContext(ctx, db.Q(`UPDATE identity_tokens SET revoked_at = ? WHERE jti = ? AND revoked_at IS NULL`), Millis(at), jti)
	if err != nil {
		return fmt.Errorf("revoke identity token: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err) // dir is a constant of this package
	}
	return sub
}
