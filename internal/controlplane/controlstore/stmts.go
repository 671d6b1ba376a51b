package controlstore

import (
	"context"
	"database/sql"
)

// Stmts runs statements on one connection or transaction, each prepared
// once and then reused: database/sql prepares nothing ahead, and parsing a
// statement again for every use costs about a tenth of a small write's CPU
// on SQLite. Not safe for concurrent use. Close closes the statements; a
// transaction's end closes those prepared on it.
type Stmts struct {
	on preparer
	m  map[string]*sql.Stmt
}

// preparer is a *sql.Conn or a *sql.Tx.
type preparer interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// NewStmts returns a statement cache over on (a *sql.Conn or *sql.Tx).
func NewStmts(on preparer) *Stmts { return &Stmts{on: on, m: map[string]*sql.Stmt{}} }

func (s *Stmts) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	if st := s.m[query]; st != nil {
		return st, nil
	}
	st, err := s.on.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	s.m[query] = st
	return st, nil
}

// ExecContext runs query's prepared statement with args.
func (s *Stmts) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

// QueryRowContext runs query's prepared statement with args. A statement
// that cannot be prepared is run unprepared, which fails the same way and
// gives the error as a *sql.Row does.
func (s *Stmts) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return s.on.QueryRowContext(ctx, query, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

// QueryContext runs query's prepared statement with args.
func (s *Stmts) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// Close closes every statement prepared so far.
func (s *Stmts) Close() {
	for q, st := range s.m {
		st.Close()
		delete(s.m, q)
	}
}
