package controlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/talkide/talkide/internal/controlplane/pgdsn"
)

// IsPostgresURL reports whether s is a PostgreSQL connection URL
// (postgres:// or postgresql://), the form TALKIDE_DATABASE_URL takes.
func IsPostgresURL(s string) bool {
	return pgdsn.IsURL(s)
}

// OpenPostgres connects to the PostgreSQL database at dsn (a postgres:// URL;
// extra query parameters such as search_path are sent as run-time
// parameters), checks the connection and migrates the schema. Concurrent
// control-plane replicas starting at once are serialised by a PostgreSQL
// advisory lock around the migrations.
//
// The connection pool keeps up to maxConns connections (0 means 32).
// Errors name the host, never a password: neither the URL's nor one in its
// query (password=, sslpassword=), nor one the driver quotes back.
func OpenPostgres(ctx context.Context, dsn string, maxConns int) (*DB, error) {
	where := pgdsn.Redact(dsn)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("open postgres %s: %w", where, pgdsn.ScrubError(err, dsn))
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
		return nil, fmt.Errorf("connect postgres %s: %w", where, pgdsn.ScrubError(err, dsn))
	}
	return migrate(ctx, db, Postgres)
}
