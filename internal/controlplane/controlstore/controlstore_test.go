package controlstore

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/pgtest"
)

// opener opens a fresh, migrated, empty database for one test.
type opener func(t *testing.T) *DB

// openers are the implementations every conformance test runs against.
var openers = map[string]opener{
	"sqlite": func(t *testing.T) *DB {
		db, err := OpenSQLite(t.Context(), filepath.Join(t.TempDir(), "cp.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	},
	"postgres": func(t *testing.T) *DB {
		db, err := OpenPostgres(t.Context(), pgtest.SchemaURL(t), 4)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	},
}

// TestConformance runs the store's behaviour tests on SQLite and PostgreSQL.
func TestConformance(t *testing.T) {
	tests := map[string]func(t *testing.T, db *DB){
		"RoundTrip":        testRoundTrip,
		"MigrateTwice":     testMigrateTwice,
		"DialectRoundTrip": testDialectTypes,
		"WorkerRecords":    testWorkerRecords,
		"IdentityRetiring": testIdentityRetiring,
		"CreateUser":       testCreateUser,
		"BookedCalls":      testBookedCalls,
	}
	for store, open := range openers {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			for name, test := range tests {
				t.Run(name, func(t *testing.T) { test(t, open(t)) })
			}
		})
	}
}

// testMigrateTwice checks that opening a migrated database again is a no-op.
func testMigrateTwice(t *testing.T, db *DB) {
	again, err := migrate(t.Context(), db.SQL, db.Dialect)
	if err != nil {
		t.Fatalf("second migration: %v", err)
	}
	if again.Dialect != db.Dialect {
		t.Errorf("dialect: got %s, want %s", again.Dialect, db.Dialect)
	}
}

// testDialectTypes checks that int64 amounts near the top of the range and
// empty strings survive a round trip on both dialects (money is BIGINT).
func testDialectTypes(t *testing.T, db *DB) {
	ctx := context.Background()
	const big = int64(1) << 60
	if _, err := db.SQL.ExecContext(ctx, db.Q(`INSERT INTO budget_limits (user_id, limit_nano) VALUES (?, ?)`), "", big); err != nil {
		t.Fatal(err)
	}
	var got int64
	if err := db.SQL.QueryRowContext(ctx, db.Q(`SELECT limit_nano FROM budget_limits WHERE user_id = ?`), "").Scan(&got); err != nil || got != big {
		t.Errorf("got %d, %v; want %d", got, err, big)
	}
}

func testRoundTrip(t *testing.T, db *DB) {
	ctx := t.Context()
	if err := db.UpsertUser(ctx, User{ID: "u1", TokenHash: "h1"}, [2]string{"demo", "dev"}); err != nil {
		t.Fatal(err)
	}
	// Re-upserting replaces the hash and keeps grants idempotent.
	if err := db.UpsertUser(ctx, User{ID: "u1", TokenHash: "h2"}, [2]string{"demo", "dev"}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.UserByTokenHash(ctx, "h1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("old hash: got %v, want ErrNotFound", err)
	}
	u, err := db.UserByTokenHash(ctx, "h2")
	if err != nil || u.ID != "u1" {
		t.Fatalf("user: got %+v, %v", u, err)
	}
	for _, tc := range []struct {
		tenant, env string
		want        bool
	}{{"demo", "dev", true}, {"demo", "prod", false}, {"other", "dev", false}} {
		got, err := db.HasGrant(ctx, "u1", tc.tenant, tc.env)
		if err != nil || got != tc.want {
			t.Errorf("HasGrant(%s/%s) = %v, %v; want %v", tc.tenant, tc.env, got, err, tc.want)
		}
	}
	c := Conversation{ID: "c1", Tenant: "demo", Env: "dev", UserID: "u1", CreatedAt: time.UnixMilli(1234).UTC()}
	if err := db.CreateConversation(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateConversation(ctx, c); err == nil {
		t.Error("duplicate conversation id accepted")
	}
	got, err := db.Conversation(ctx, "c1")
	if err != nil || got != c {
		t.Errorf("conversation: got %+v, %v; want %+v", got, err, c)
	}
	if _, err := db.Conversation(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing conversation: got %v", err)
	}
	it := IdentityToken{JTI: "j1", Tenant: "demo", Env: "dev", IssuedAt: time.UnixMilli(1).UTC(), ExpiresAt: time.UnixMilli(2).UTC()}
	if err := db.RecordIdentityToken(ctx, it); err != nil {
		t.Fatal(err)
	}
	if err := db.RevokeIdentityToken(ctx, "j1", time.UnixMilli(3)); err != nil {
		t.Fatal(err)
	}
	gt, err := db.IdentityTokenByID(ctx, "j1")
	if err != nil || gt.RevokedAt == nil || gt.RevokedAt.UnixMilli() != 3 {
		t.Errorf("revoked token: got %+v, %v", gt, err)
	}
	if err := db.RevokeIdentityToken(ctx, "j1", time.Now()); !errors.Is(err, ErrNotFound) {
		t.Errorf("second revoke: got %v, want ErrNotFound", err)
	}
}

func TestQRebind(t *testing.T) {
	pg := &DB{Dialect: Postgres}
	if got := pg.Q("a = ? AND b = ?"); got != "a = $1 AND b = $2" {
		t.Errorf("got %q", got)
	}
	lite := &DB{Dialect: SQLite}
	if got := lite.Q("a = ?"); got != "a = ?" {
		t.Errorf("got %q", got)
	}
}

// testCreateUser: CreateUser refuses an existing id and leaves that user's
// token and grants as they were.
func testCreateUser(t *testing.T, db *DB) {
	ctx := t.Context()
	if err := db.CreateUser(ctx, User{ID: "alice", TokenHash: "ha"}, [2]string{"demo", "dev"}); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateUser(ctx, User{ID: "alice", TokenHash: "hb"}, [2]string{"acme", "prod"}); !errors.Is(err, ErrExists) {
		t.Errorf("second create: got %v, want ErrExists", err)
	}
	if u, err := db.UserByTokenHash(ctx, "ha"); err != nil || u.ID != "alice" {
		t.Errorf("the first token after a refused create: got %+v, %v; want alice", u, err)
	}
	if _, err := db.UserByTokenHash(ctx, "hb"); !errors.Is(err, ErrNotFound) {
		t.Errorf("the refused create's token: got %v, want ErrNotFound", err)
	}
	if ok, err := db.HasGrant(ctx, "alice", "acme", "prod"); err != nil || ok {
		t.Errorf("the refused create's grant: got %v, %v; want none", ok, err)
	}
	if ok, err := db.HasGrant(ctx, "alice", "demo", "dev"); err != nil || !ok {
		t.Errorf("grant: got %v, %v; want demo/dev", ok, err)
	}
}
