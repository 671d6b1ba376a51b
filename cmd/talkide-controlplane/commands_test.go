package main

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/token"
)

func TestOperatorCommands(t *testing.T) {
	mk, _ := token.NewMasterKey("k1")
	t.Setenv("TALKIDE_MASTER_KEYS", mk.String())
	dbPath := filepath.Join(t.TempDir(), "not", "yet", "there", "cp.db")
	t.Setenv("TALKIDE_DB_PATH", dbPath)
	t.Setenv("TALKIDE_DATABASE_URL", "")
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		_, err := command(ctx, args, &out, log)
		return out.String(), err
	}

	if out, err := run("help"); err != nil || !strings.Contains(out, "add-user") {
		t.Errorf("help: %q, %v", out, err)
	}
	if _, err := run("frobnicate"); err == nil || !strings.Contains(err.Error(), "help") {
		t.Errorf("unknown command: %v", err)
	}
	if out, err := run("new-master-key", "-id", "2026b"); err != nil || !strings.HasPrefix(out, "2026b:") {
		t.Errorf("new-master-key -id: %q, %v", out, err)
	}
	out, err := run("add-user", "-id", "alice", "-grant", "acme/dev")
	if err != nil {
		t.Fatalf("add-user (with a database directory that does not exist yet): %v", err)
	}
	tok := strings.TrimSpace(out[strings.LastIndex(out, " ")+1:])
	db, err := controlstore.OpenSQLite(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	u, err := db.UserByTokenHash(ctx, controlstore.HashUserToken(tok))
	if err != nil || u.ID != "alice" {
		t.Fatalf("user from the printed token: %+v, %v", u, err)
	}
	if ok, _ := db.HasGrant(ctx, "alice", "acme", "dev"); !ok {
		t.Error("add-user did not grant acme/dev")
	}
	db.Close()
	if _, err := run("add-user", "-id", " bob\n", "-grant", "acme/dev"); err == nil {
		t.Error("add-user accepted a user id the admin API cannot name")
	}
	if _, err := run("add-user", "-id", "bob", "-grant", "Not A Tenant"); err == nil {
		t.Error("add-user accepted a malformed grant")
	}

	out, err = run("worker-credentials", "-tenant", "acme", "-env", "dev")
	if err != nil {
		t.Fatal(err)
	}
	idTok := strings.TrimPrefix(strings.SplitN(out, "\n", 2)[0], "TALKIDE_WORKER_IDENTITY_TOKEN=")
	c, err := token.NewVerifier(token.PurposeIdentity, mk.Derive(token.PurposeIdentity, "", "")).Verify(idTok)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run("revoke-identity", "-jti", c.ID); err != nil || !strings.Contains(out, c.ID) {
		t.Fatalf("revoke-identity: %q, %v", out, err)
	}
	if _, err := run("revoke-identity", "-jti", c.ID); err == nil {
		t.Error("revoking twice: want an error")
	}
}
