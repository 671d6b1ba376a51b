// Package pgtest gives tests an isolated PostgreSQL schema on the server
// the platform's tests use (TALKIDE_TEST_POSTGRES_URL, default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable): each call
// creates a fresh schema, returns a URL whose connections use it, and drops
// it when the test ends.
//
// An unreachable server fails the test with a clear message, so a CI
// machine without PostgreSQL cannot pass silently; set
// TALKIDE_SKIP_POSTGRES=1 to skip such tests instead. It is for tests only.
package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/talkide/talkide/internal/controlplane/pgdsn"
	"github.com/talkide/talkide/internal/token"
)

// DefaultURL is the test server when TALKIDE_TEST_POSTGRES_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// ServerURL returns the test server's URL.
func ServerURL() string {
	if v := os.Getenv("TALKIDE_TEST_POSTGRES_URL"); v != "" {
		return v
	}
	return DefaultURL
}

// SchemaURL creates a fresh, empty schema for t and returns a connection URL
// whose search_path is that schema. The schema and everything in it are
// dropped when t ends.
func SchemaURL(t testing.TB) string {
	t.Helper()
	if os.Getenv("TALKIDE_SKIP_POSTGRES") == "1" {
		t.Skip("TALKIDE_SKIP_POSTGRES=1: skipping a PostgreSQL test")
	}
	base := ServerURL()
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatalf("pgtest: open %s: %v", pgdsn.Redact(base), pgdsn.ScrubError(err, base))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := admin.PingContext(ctx); err != nil {
		admin.Close()
		t.Fatalf("pgtest: PostgreSQL at %s is unreachable: %v\n"+
			"The budget and control-store tests need it (start it, or point TALKIDE_TEST_POSTGRES_URL at one); "+
			"set TALKIDE_SKIP_POSTGRES=1 to skip these tests.", pgdsn.Redact(base), pgdsn.ScrubError(err, base))
	}
	schema := "t_" + strings.ToLower(token.NewID()[:16])
	if _, err := admin.ExecContext(ctx, `CREATE SCHEMA `+schema); err != nil {
		admin.Close()
		t.Fatalf("pgtest: create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			t.Errorf("pgtest: drop schema %s: %v", schema, err)
		}
		admin.Close()
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", pgdsn.Redact(base), pgdsn.ScrubError(err, base))
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// String describes the server for logs, with no password in it.
func String() string { return fmt.Sprintf("PostgreSQL at %s", pgdsn.Redact(ServerURL())) }
