package controlstore

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
)

// IsPostgresURL reports whether s is a PostgreSQL connection URL
// (postgres:// or postgresql://), the form TALKIDE_DATABASE_URL takes.
func IsPostgresURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// OpenPostgres connects to the PostgreSQL database at dsn (a postgres:// URL;
// extra query parameters such as search_path are sent as run-time
// parameters), checks the connection and migrates the schema. Concurrent
// control-plane replicas starting at once are serialised by a PostgreSQL
// advisory lock around the migrations.
//
// The connection pool keeps up to maxConns connections (0 means 32).
// Errors name the host, never the password.
func OpenPostgres(ctx context.Context, dsn string, maxConns int) (*DB, error) {
	where := redactURL(dsn)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("open postgres %s: %w", where, err)
	}
	if maxConns <= 0 {
		maxConns = 32
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("connect postgres %s: %w", where, err)
	}
	return migrate(ctx, db, Postgres)
}

// redactURL returns dsn without its password, for messages.
func redactURL(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
