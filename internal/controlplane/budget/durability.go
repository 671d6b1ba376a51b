package budget

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"os"
	"time"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
)

// WALSyncInterval bounds how long a commit to the SQLite write-ahead log
// may wait for its fsync (see tx).
const WALSyncInterval = 200 * time.Millisecond

// syncer fsyncs the SQLite write-ahead log every WALSyncInterval when
// something was committed since the last time, on its own goroutine: an
// fsync after every batch made the writer wait on the disk, and fsyncs
// racing the writer's appends slowed both (measured: docs/benchmarks.md).
// It stops after a last sync once the writer has stopped.
func (s *Service) syncer() {
	defer close(s.syncDone)
	if s.db.Dialect != controlstore.SQLite {
		return
	}
	t := time.NewTicker(WALSyncInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if s.dirty.Swap(false) {
				s.syncWAL()
			}
		case <-s.done:
			s.syncWAL()
			return
		}
	}
}

// syncWAL fsyncs the SQLite write-ahead log, making every commit so far
// survive a power cut (see tx). A failure is logged: the commits are still
// in the operating system, and SQLite syncs the log at its next checkpoint.
func (s *Service) syncWAL() {
	if s.db.Path == "" {
		return
	}
	f, err := os.OpenFile(s.db.Path+"-wal", os.O_RDWR, 0)
	if err == nil {
		err = datasync(f)
		f.Close()
	}
	if err != nil {
		s.log.Error("sync budget write-ahead log", "err", err)
	}
}

// tx runs ops in one transaction on the writer's connection.
//
// Durability. A forwarded call must have its reservation on disk, and a
// debit must never be lost:
//   - PostgreSQL: a batch holding a reservation commits durably
//     (synchronous_commit on); a batch of settlements and expiries only
//     commits without waiting for the WAL flush.
//   - SQLite (WAL, synchronous=NORMAL on the writer's connection): every
//     commit is in the operating system when COMMIT returns, so it survives
//     a crash of the process at once; the syncer goroutine fsyncs the log
//     every WALSyncInterval, so a power cut or kernel crash of the machine
//     (which also ends every call in flight) can lose at most that last
//     fraction of a second of budget writes, as PostgreSQL's
//     synchronous_commit=off would. The embedded store is the one-machine
//     default; TALKIDE_DATABASE_URL (PostgreSQL) makes every reservation
//     durable before its call is forwarded.
//
// A lost settlement (a crash before its flush) leaves the reservation open;
// it is charged in full when it expires: a debit overstated, never lost.
func (s *Service) tx(ops []*op) error {
	ctx := context.Background() // the batch is not any one caller's
	durable := false
	for _, o := range ops {
		durable = durable || o.reserve != nil
	}
	w, err := s.writerConn(ctx)
	if err != nil {
		return fmt.Errorf("budget transaction: %w", err)
	}
	if err := w.begin(ctx, durable); err != nil {
		s.dropWriter()
		return fmt.Errorf("budget transaction: %w", err)
	}
	for _, o := range ops {
		switch {
		case o.reserve != nil:
			err = s.reserveTx(ctx, w, o.reserve)
		case o.settle != nil:
			err = s.settleTx(ctx, w, o.settle)
		case o.expire != nil:
			err = s.expireTx(ctx, w, o.expire)
		}
		if err != nil {
			s.rollback(ctx)
			return err
		}
	}
	if err := w.commit(ctx); err != nil {
		s.rollback(ctx)
		return fmt.Errorf("budget transaction: commit: %w", err)
	}
	return nil
}

// rollback ends the writer's failed transaction; a connection that cannot
// even roll back is dropped.
func (s *Service) rollback(ctx context.Context) {
	if _, err := s.w.conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		s.dropWriter()
	}
}

// dropWriter closes the writer's connection without returning it to the
// pool; the next batch opens a new one.
func (s *Service) dropWriter() {
	if s.w == nil {
		return
	}
	s.w.Close()
	s.w.conn.Raw(func(any) error { return driver.ErrBadConn })
	s.w.conn.Close()
	s.w = nil
}

// querier is what the store steps run their SQL on: the writer's
// connection inside its transaction.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// writerConn is the writer's connection, with its prepared statements
// (preparing each statement anew cost a tenth of the CPU of a call on
// SQLite). Used only by the holder of Service.conn: the writer goroutine
// (settlements, expiries) or, on SQLite, a caller leading a batch of
// reservations (lead).
type writerConn struct {
	*controlstore.Stmts // ExecContext, QueryRowContext, QueryContext
	conn                *sql.Conn
	dialect             controlstore.Dialect
	// syncSet is true once the SQLite connection runs with
	// synchronous=NORMAL.
	syncSet bool
}

func (s *Service) writerConn(ctx context.Context) (*writerConn, error) {
	if s.w != nil {
		return s.w, nil
	}
	c, err := s.db.SQL.Conn(ctx)
	if err != nil {
		return nil, err
	}
	s.w = &writerConn{Stmts: controlstore.NewStmts(c), conn: c, dialect: s.db.Dialect}
	return s.w, nil
}

func (w *writerConn) begin(ctx context.Context, durable bool) error {
	if w.dialect == controlstore.SQLite && !w.syncSet {
		if _, err := w.conn.ExecContext(ctx, "PRAGMA synchronous = NORMAL"); err != nil {
			return err
		}
		w.syncSet = true
	}
	begin := "BEGIN"
	if w.dialect == controlstore.SQLite {
		begin = "BEGIN IMMEDIATE"
	}
	if _, err := w.conn.ExecContext(ctx, begin); err != nil {
		return err
	}
	if w.dialect == controlstore.Postgres && !durable {
		if _, err := w.conn.ExecContext(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
			return err
		}
	}
	return nil
}

func (w *writerConn) commit(ctx context.Context) error {
	_, err := w.conn.ExecContext(ctx, "COMMIT")
	return err
}
