package controlstore

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func TestSQLiteRoundTrip(t *testing.T) {
	ctx := t.Context()
	db, err := OpenSQLite(ctx, filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
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
