package budget

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/controlstore"
	"github.com/talkide/talkide/internal/token"
)

// ErrDenied is returned (wrapped in a *DenyError) by PreCallCheck when the
// call could push the user past their spending limit for the period.
var ErrDenied = errors.New("budget exceeded")

// ErrFairUse is returned (wrapped in a *FairUseError) by PreCallCheck when
// the user made too many calls or used too many tokens in the fair-use
// window.
var ErrFairUse = errors.New("fair-use limit reached")

// ErrClosed is returned by calls on a closed Service.
var ErrClosed = errors.New("budget service closed")

// DenyError is the ErrDenied of one user and period; it says how much is
// left so the message can tell the user. Amounts are nano-USD.
type DenyError struct {
	UserID    string
	Period    string
	Limit     NanoUSD
	Committed NanoUSD // spent + reserved
	Needed    NanoUSD // the call's worst case
}

func (e *DenyError) Error() string {
	return fmt.Sprintf("budget exceeded: user %s period %s: limit %d, committed %d, call needs up to %d nano-USD",
		e.UserID, e.Period, e.Limit, e.Committed, e.Needed)
}

func (e *DenyError) Unwrap() error { return ErrDenied }

// FairUseError is the ErrFairUse of one user: which limit was reached and
// when a call may succeed again.
type FairUseError struct {
	UserID string
	// Limit is "requests" or "tokens".
	Limit      string
	RetryAfter time.Duration
}

func (e *FairUseError) Error() string {
	return fmt.Sprintf("fair-use limit reached: user %s: too many %s in the window; retry after %s", e.UserID, e.Limit, e.RetryAfter)
}

func (e *FairUseError) Unwrap() error { return ErrFairUse }

// PeriodKind is the length of a budget period.
type PeriodKind string

const (
	// Monthly periods are UTC calendar months ("2026-11"), the default.
	Monthly PeriodKind = "month"
	// Weekly periods are ISO weeks ("2026-W48").
	Weekly PeriodKind = "week"
	// Daily periods are UTC days ("2026-11-30").
	Daily PeriodKind = "day"
)

// Key returns the period that contains t.
func (k PeriodKind) Key(t time.Time) string {
	t = t.UTC()
	switch k {
	case Daily:
		return t.Format(time.DateOnly)
	case Weekly:
		y, w := t.ISOWeek()
		return fmt.Sprintf("%04d-W%02d", y, w)
	}
	return t.Format("2006-01")
}

// ParsePeriodKind parses "month", "week" or "day" ("" is month).
func ParsePeriodKind(s string) (PeriodKind, error) {
	switch PeriodKind(s) {
	case "", Monthly:
		return Monthly, nil
	case Weekly, Daily:
		return PeriodKind(s), nil
	}
	return "", fmt.Errorf("budget period %q: want month, week or day", s)
}

// FairUse limits a user's calls in a rolling window, across periods. A zero
// field is no limit; a zero Window turns fair use off.
type FairUse struct {
	Window time.Duration
	// MaxRequests is the most calls admitted in any Window.
	MaxRequests int64
	// MaxTokens is the most tokens (every kind, output included; an open
	// call counts its estimated prompt) after which no call is admitted
	// until older calls leave the window.
	MaxTokens int64
}

func (f FairUse) on() bool { return f.Window > 0 && (f.MaxRequests > 0 || f.MaxTokens > 0) }

// Config configures a Service. Zero values take the defaults noted.
type Config struct {
	// DefaultLimit is a user's limit per period when neither the user nor
	// the call's tenant has one, in nano-USD. Zero means 100 USD.
	DefaultLimit NanoUSD
	// Period is the budget period. Default Monthly.
	Period PeriodKind
	// ReservationTTL is how long an unsettled reservation holds budget
	// before it expires. An expired reservation is charged in full (its
	// worst case): the call was admitted and may have spent up to that,
	// and a debit must never be lost; a late settlement replaces that
	// charge with the actual cost. Default 30 minutes (longer than any
	// stream the gateway lets run).
	ReservationTTL time.Duration
	// FairUse is the fair-use policy; zero means none.
	FairUse FairUse
	// Logger logs background failures. Default slog.Default().
	Logger *slog.Logger
	// Metrics, when set, receives the service's measurements.
	Metrics *Metrics
	// NoPrediction makes every PreCallCheckAsync wait for the durable
	// reservation, so a call is forwarded only once it is on disk (see
	// pipeline.go for what prediction trades).
	NoPrediction bool
	// CommitDelay is how long a predicted reservation waits before its
	// commit starts, unless Ticket.Begin starts it earlier. Default
	// CommitDelay (the constant).
	CommitDelay time.Duration
}

// Service is the UserBudgetService over the control-plane database
// (SQLite or PostgreSQL). Budget writes other than limit changes go through
// one writer connection and are committed in batches: settlements and
// expiries by the writer goroutine (settlements wait up to SettleDelay for
// company), SQLite reservations by the first waiting caller (see lead). On
// PostgreSQL reservations are instead committed by the first waiting caller
// as one statement on any pooled connection, serialised per user by a row
// lock. PreCallCheckAsync predicts and pipelines checks (pipeline.go). Safe
// for concurrent use. Close stops it.
type Service struct {
	db  *controlstore.DB
	cfg Config
	// clock is the time source (func() time.Time); tests replace it.
	clock atomic.Value
	log   *slog.Logger

	ops chan *op
	// conn is a token (capacity 1) held by whoever uses the writer's
	// connection: the writer goroutine, or a caller leading a batch of
	// reservations (SQLite; see lead).
	conn chan struct{}
	// pgLeader is the token (capacity 1) of a caller leading a batch of
	// reservations on PostgreSQL (see lead); they use a pooled connection.
	pgLeader chan struct{}
	// qmu guards queue, the reservations waiting for a leader, in the
	// order they were made.
	qmu   sync.Mutex
	queue []*op
	// connGone is set, holding conn, once the writer closed its
	// connection for good.
	connGone bool
	// dirty is set by the writer after a commit, cleared by the syncer
	// before it fsyncs the log.
	dirty    atomic.Bool
	syncDone chan struct{}
	// w is the writer goroutine's connection (nil until first used, and
	// after a failure); only the writer goroutine touches it.
	w    *writerConn
	quit chan struct{}
	done chan struct{}
	// mu guards closed: enqueuers hold it shared so Close can wait for them.
	mu     sync.RWMutex
	closed bool
	// views are the active users' budgets as last seen (pipeline.go):
	// userKey → *userView.
	views sync.Map
	// batchFailures counts reservation batches that failed as a whole
	// (PostgreSQL) and were retried one by one.
	batchFailures atomic.Int64
	// viewMu guards viewStmt, loadView's prepared query.
	viewMu   sync.Mutex
	viewStmt *sql.Stmt
}

// NewService returns a Service over db and starts its writer.
func NewService(db *controlstore.DB, cfg Config) *Service {
	if cfg.DefaultLimit <= 0 {
		cfg.DefaultLimit = 100 * NanoPerUSD
	}
	if cfg.Period == "" {
		cfg.Period = Monthly
	}
	if cfg.ReservationTTL <= 0 {
		cfg.ReservationTTL = 30 * time.Minute
	}
	if cfg.CommitDelay <= 0 {
		cfg.CommitDelay = CommitDelay
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Service{db: db, cfg: cfg, log: cfg.Logger,
		ops: make(chan *op, 1024), conn: make(chan struct{}, 1), pgLeader: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
		syncDone: make(chan struct{})}
	s.clock.Store(time.Now)
	go s.writer()
	go s.syncer()
	return s
}

func (s *Service) now() time.Time { return s.clock.Load().(func() time.Time)() }

// Close stops the writer after it committed every operation already queued.
// Calls after Close fail with ErrClosed. Close is idempotent.
func (s *Service) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.quit)
	}
	s.mu.Unlock()
	<-s.done
	<-s.syncDone
	s.viewMu.Lock()
	if s.viewStmt != nil {
		s.viewStmt.Close()
		s.viewStmt = nil
	}
	s.viewMu.Unlock()
	return nil
}

// Period returns the current period's key.
func (s *Service) Period() string { return s.cfg.Period.Key(s.now()) }

// Call is a model call to admit: who makes it and what it may cost.
type Call struct {
	UserID         string
	Tenant         string
	Env            string
	ConversationID string
	Model          string
	// RequestID is the gateway's id of the call.
	RequestID string
	// Amount is the call's worst-case cost in nano-USD.
	Amount NanoUSD
	// EstimatedTokens is the call's estimated prompt, in tokens; it counts
	// towards the fair-use token limit until the call is settled.
	EstimatedTokens int64
}

// Reservation is budget held for one call between PreCallCheck and
// PostCallDebit.
type Reservation struct {
	ID     string
	UserID string
	Tenant string
	Env    string
	Period string
	// Amount is the reserved worst case in nano-USD.
	Amount NanoUSD
}

// PreCallCheck admits c or refuses it. Admitted, it reserves c.Amount of the
// user's budget for the current period, durably, before returning. It
// returns a *DenyError (wrapping ErrDenied) when spent + reserved + c.Amount
// would exceed the user's limit, a *FairUseError (wrapping ErrFairUse) when
// the fair-use policy refuses; nothing is reserved then. The check and the
// reservation are one atomic step: concurrent checks never admit more than
// the limit, also for a user never seen before. Other errors are database
// failures.
func (s *Service) PreCallCheck(ctx context.Context, c Call) (Reservation, error) {
	if c.Amount < 0 || c.UserID == "" {
		return Reservation{}, fmt.Errorf("reserve budget: invalid amount %d for user %q", c.Amount, c.UserID)
	}
	c.Amount = min(c.Amount, MaxCost)
	now := s.now()
	o := &op{reserve: &reserveArgs{call: c, id: token.NewID(), period: s.cfg.Period.Key(now), now: now}}
	if err := s.enqueue(ctx, o); err != nil {
		return Reservation{}, err
	}
	return s.awaitReserve(o)
}

// awaitReserve leads or waits for the commit of reservation o (queued by
// enqueue); the leader has recorded the answer in the user's view.
func (s *Service) awaitReserve(o *op) (Reservation, error) {
	r := o.reserve
	start := time.Now()
	err := s.lead(o)
	if err == nil {
		err = r.result()
	}
	var res Reservation
	if err == nil {
		c := r.call
		res = Reservation{ID: r.id, UserID: c.UserID, Tenant: c.Tenant, Env: c.Env, Period: r.period, Amount: c.Amount}
	}
	s.cfg.Metrics.observeReserve(time.Since(start), err)
	return res, err
}

type reserveArgs struct {
	call   Call
	id     string
	period string
	now    time.Time
	// outcome is set by the store: ok, budget, fair_use_requests,
	// fair_use_tokens.
	outcome    string
	limit      NanoUSD
	committed  NanoUSD
	retryAfter time.Duration
}

func (r *reserveArgs) result() error {
	switch r.outcome {
	case "ok":
		return nil
	case "budget":
		return &DenyError{UserID: r.call.UserID, Period: r.period, Limit: r.limit, Committed: r.committed, Needed: r.call.Amount}
	case "fair_use_requests", "fair_use_tokens":
		return &FairUseError{UserID: r.call.UserID, Limit: strings.TrimPrefix(r.outcome, "fair_use_"), RetryAfter: max(r.retryAfter, time.Second)}
	}
	return fmt.Errorf("reserve budget: unexpected outcome %q", r.outcome)
}

// Debit describes a settled call for the ledger.
type Debit struct {
	ConversationID string
	RequestID      string
	// Outcome says how the usage was measured (complete, stream_error,
	// upstream_cut, client_disconnect, http_error, unmetered, ...).
	Outcome string
	Usage   anthropic.Usage
}

// PostCallDebit settles res with the call's actual cost in nano-USD: the
// reservation is released and actual is added to the period's spend, with a
// ledger entry, durably before it returns. Settling a reservation twice
// books nothing the second time. A reservation that already expired (and was
// charged its worst case) gets that charge refunded and actual booked. A
// reservation the database does not know is booked anyway. Errors are
// database failures; the reservation then stays open, and expires.
func (s *Service) PostCallDebit(ctx context.Context, res Reservation, actual NanoUSD, d Debit) error {
	if actual < 0 {
		return fmt.Errorf("debit budget: negative amount %d", actual)
	}
	if res.ID == "" || res.UserID == "" {
		return fmt.Errorf("debit budget: reservation without id or user")
	}
	err := s.run(ctx, &op{settle: &settleArgs{res: res, amount: min(actual, MaxCost), debit: d, now: s.now()}})
	if err == nil {
		s.cfg.Metrics.observeDebit(res, actual, d)
	}
	return err
}

type settleArgs struct {
	res    Reservation
	amount NanoUSD
	debit  Debit
	now    time.Time
	result string
}

// op is one write for the writer goroutine.
type op struct {
	ctx     context.Context
	reserve *reserveArgs
	settle  *settleArgs
	expire  *expireArgs
	done    chan error
	// predicted marks a reservation admitted on a prediction (pipeline.go).
	predicted bool
}

// finish ends o with err: a reservation's answer goes into the user's view
// first, by the leader, in the order the batch committed, so the view
// always holds the latest answer.
func (s *Service) finish(o *op, err error) {
	if o.reserve != nil {
		s.answered(o.reserve, o.predicted, err)
	}
	o.done <- err
}

type expireArgs struct {
	now     time.Time
	expired int
}

// run queues o for the writer and waits until it is committed (or failed).
// A caller whose ctx ends while o is queued gets ctx's error and o is
// skipped; once the writer took o, run waits for its outcome regardless of
// ctx, so a caller always learns whether a reservation was made.
func (s *Service) run(ctx context.Context, o *op) error {
	o.ctx, o.done = ctx, make(chan error, 1)
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	select {
	case s.ops <- o:
	case <-ctx.Done():
		s.mu.RUnlock()
		return ctx.Err()
	}
	s.mu.RUnlock()
	return <-o.done
}

// enqueue queues reservation o for the next batch (see lead). Reservations
// are committed in the order they were queued, so a call this process
// admitted first is never refused because a later one took its budget.
func (s *Service) enqueue(ctx context.Context, o *op) error {
	o.ctx, o.done = ctx, make(chan error, 1)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	s.qmu.Lock()
	s.queue = append(s.queue, o)
	s.qmu.Unlock()
	return nil
}

// lead waits until queued reservation o is committed, without a hand-off to
// a goroutine: whichever waiting caller gets the leader's token first
// commits everything queued, on its own goroutine, as one batch (group
// commit: under load one commit serves many calls; alone, a call pays no
// goroutine switch). On SQLite the token is the writer's connection and the
// batch one transaction; on PostgreSQL the batch is one statement on a
// pooled connection (reservePostgres). A caller whose op another leader
// took returns as soon as it is done.
func (s *Service) lead(o *op) error {
	token := s.conn
	if s.db.Dialect == controlstore.Postgres {
		token = s.pgLeader
	}
	for {
		select {
		case err := <-o.done:
			return err
		case <-o.ctx.Done():
			// Still queued: take it back, nothing was written. Taken by a
			// leader: wait for its outcome, so the caller learns whether
			// a reservation was made.
			if s.unqueue(o) {
				return o.ctx.Err()
			}
			return <-o.done
		case token <- struct{}{}:
			s.qmu.Lock()
			batch := s.queue
			s.queue = nil
			s.qmu.Unlock()
			if len(batch) > 0 {
				s.commitReserves(batch)
			}
			<-token
		}
	}
}

// unqueue removes o from the queue; false when a leader has taken it.
func (s *Service) unqueue(o *op) bool {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	for i, q := range s.queue {
		if q == o {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			return true
		}
	}
	return false
}

// commitReserves commits a batch of queued reservations; the caller holds
// the leader's token.
func (s *Service) commitReserves(batch []*op) {
	if s.db.Dialect == controlstore.Postgres {
		s.reservePostgres(batch)
		return
	}
	s.commitHeld(batch)
}

// maxBatch bounds the operations committed in one transaction.
const maxBatch = 128

// writer commits queued operations in batches until Close, then commits what
// is left. Every expiry sweep also runs here.
func (s *Service) writer() {
	defer close(s.done)
	defer func() {
		s.conn <- struct{}{}
		s.pgLeader <- struct{}{}
		// Reservations queued before Close but not yet led.
		s.qmu.Lock()
		left := s.queue
		s.queue = nil
		s.qmu.Unlock()
		if len(left) > 0 {
			s.commitReserves(left)
		}
		<-s.pgLeader
		if s.w != nil {
			for _, st := range s.w.stmts {
				st.Close()
			}
			s.w.conn.Close()
			s.w = nil
		}
		s.connGone = true
		<-s.conn
	}()
	sweep := time.NewTicker(min(s.cfg.ReservationTTL/4, time.Minute))
	defer sweep.Stop()
	// Settlements wait up to SettleDelay for company: nobody waits on them
	// but the gateway's background goroutine, and committing many in one
	// transaction writes each page once and keeps the writer free for
	// reservations, which callers do wait on.
	var settles []*op
	settleTimer := time.NewTimer(time.Hour)
	settleTimer.Stop()
	flushSettles := func() {
		// In chunks, handing the connection back in between, so a
		// reservation never waits behind more than one chunk.
		for len(settles) > 0 {
			n := min(len(settles), maxSettleBatch)
			s.commit(settles[:n])
			settles = settles[n:]
		}
		settles = nil
	}
	batch := make([]*op, 0, maxBatch)
	for {
		select {
		case o := <-s.ops:
			batch = append(batch[:0], o)
		drain:
			for len(batch) < maxBatch {
				select {
				case o := <-s.ops:
					batch = append(batch, o)
				default:
					break drain
				}
			}
			now := batch[:0:0]
			for _, o := range batch {
				if o.settle != nil {
					if len(settles) == 0 {
						settleTimer.Reset(SettleDelay)
					}
					settles = append(settles, o)
					continue
				}
				now = append(now, o)
			}
			if len(now) > 0 {
				s.commit(now)
			}
			if len(settles) >= maxSettleBatch {
				settleTimer.Stop()
				flushSettles()
			}
		case <-settleTimer.C:
			flushSettles()
		case <-sweep.C:
			s.evictViews(s.now())
			flushSettles()
			o := &op{ctx: context.Background(), expire: &expireArgs{now: s.now()}, done: make(chan error, 1)}
			s.commit([]*op{o})
			if err := <-o.done; err != nil {
				s.log.Error("expire budget reservations", "err", err)
			}
		case <-s.quit:
			flushSettles()
			for {
				select {
				case o := <-s.ops:
					s.commit([]*op{o})
				default:
					return
				}
			}
		}
	}
}

// SettleDelay is the longest a settlement waits to be committed with
// others (see writer).
const SettleDelay = 5 * time.Millisecond

// maxSettleBatch bounds the settlements committed in one transaction (a few
// milliseconds of work a reservation may wait behind).
const maxSettleBatch = 32

// commit runs ops in one transaction, holding the connection token.
func (s *Service) commit(ops []*op) {
	s.conn <- struct{}{}
	s.commitHeld(ops)
	<-s.conn
}

// commitHeld runs ops in one transaction; the caller holds the connection
// token. When any fails, the transaction is
// rolled back and each op is retried in its own, so one bad op cannot fail
// the others.
func (s *Service) commitHeld(ops []*op) {
	if s.connGone {
		for _, o := range ops {
			s.finish(o, ErrClosed)
		}
		return
	}
	live := s.live(ops)
	if len(live) == 0 {
		return
	}
	if s.db.Dialect == controlstore.Postgres {
		byUser(live) // row locks in one order everywhere: no deadlocks
	}
	if err := s.tx(live); err == nil || len(live) == 1 {
		for _, o := range live {
			s.finish(o, err)
		}
	} else {
		for _, o := range live {
			s.finish(o, s.tx([]*op{o}))
		}
	}
	s.dirty.Store(true)
}

// WALSyncInterval bounds how long a commit to the SQLite write-ahead log
// may wait for its fsync (see tx).
const WALSyncInterval = 200 * time.Millisecond

// syncer fsyncs the SQLite write-ahead log every WALSyncInterval when
// something was committed since the last time, on its own goroutine: an
// fsync after every batch made the writer wait on the disk, and fsyncs
// racing the writer's appends slowed both (measured: README "Benchmark").
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
	for _, st := range s.w.stmts {
		st.Close()
	}
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

// writerConn is the writer goroutine's own connection, with its prepared
// statements (preparing each statement anew cost a tenth of the CPU of a
// call on SQLite). Used by the writer goroutine only.
type writerConn struct {
	conn    *sql.Conn
	dialect controlstore.Dialect
	stmts   map[string]*sql.Stmt
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
	s.w = &writerConn{conn: c, dialect: s.db.Dialect, stmts: map[string]*sql.Stmt{}}
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

func (w *writerConn) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	if st, ok := w.stmts[query]; ok {
		return st, nil
	}
	st, err := w.conn.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	w.stmts[query] = st
	return st, nil
}

func (w *writerConn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := w.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

func (w *writerConn) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	st, err := w.stmt(ctx, query)
	if err != nil {
		// A *sql.Row carrying err: query the connection unprepared, which
		// fails the same way.
		return w.conn.QueryRowContext(ctx, query, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

func (w *writerConn) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := w.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// live ends the ops whose caller gave up before anything was written and
// returns the others, counting them as one batch.
func (s *Service) live(ops []*op) []*op {
	live := ops[:0:0]
	for _, o := range ops {
		if err := o.ctx.Err(); err != nil {
			s.finish(o, err)
			continue
		}
		live = append(live, o)
	}
	if len(live) > 0 {
		s.cfg.Metrics.observeBatch(len(live))
	}
	return live
}

// reservePostgres runs a batch of pre-call checks as one statement that
// calls the talkide_budget_reserve function (controlstore/pgsql) once per
// reservation, in one transaction on a pooled connection: ordered by user,
// each user's in the order they were admitted (byUser). When the statement
// fails, each reservation is retried in a statement of its own, so one bad
// reservation cannot fail the others.
func (s *Service) reservePostgres(batch []*op) {
	live := s.live(batch)
	if len(live) == 0 {
		return
	}
	byUser(live)
	err := s.reservePostgresBatch(live)
	if err == nil {
		for _, o := range live {
			s.finish(o, nil)
		}
		return
	}
	s.batchFailures.Add(1)
	s.log.Warn("budget reservation batch failed; retrying each reservation alone", "reservations", len(live), "err", err)
	for _, o := range live {
		err := s.reservePostgresBatch([]*op{o})
		if err != nil && s.reservedBefore(o.reserve) {
			err = nil
		}
		s.finish(o, err)
	}
}

// byUser orders a batch by user, keeping each user's calls in the order
// they were admitted: every transaction that locks several users' usage
// rows (reservation batches, settlement batches, expiry sweeps, on any
// replica) locks them in this order, so none waits for another in a cycle.
func byUser(ops []*op) {
	slices.SortStableFunc(ops, func(a, b *op) int { return strings.Compare(a.user(), b.user()) })
}

func (o *op) user() string {
	switch {
	case o.reserve != nil:
		return o.reserve.call.UserID
	case o.settle != nil:
		return o.settle.res.UserID
	}
	return ""
}

// reservedBefore reports whether r's reservation is in the database
// although its statement failed (it committed, then the answer was lost):
// then it was admitted, and its view numbers are unknown.
func (s *Service) reservedBefore(r *reserveArgs) bool {
	var one int
	if s.db.SQL.QueryRowContext(context.Background(), `SELECT 1 FROM budget_reservations WHERE id = $1`, r.id).Scan(&one) != nil {
		return false
	}
	r.outcome, r.limit = "ok", -1
	return true
}

// reserveBatchTimeout bounds one batch statement: a row lock held for
// longer (a stuck transaction elsewhere) fails the batch instead of
// stalling every reservation of this process behind it.
const reserveBatchTimeout = 30 * time.Second

func (s *Service) reservePostgresBatch(ops []*op) error {
	f := s.cfg.FairUse
	var window int64
	if f.on() {
		window = f.Window.Milliseconds()
	}
	n := len(ops)
	ids, ledgerIDs, users, tenants, envs := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	convs, models, reqIDs, periods := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	amounts, estimates, nows, expires := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, o := range ops {
		r := o.reserve
		c := r.call
		ids[i], ledgerIDs[i], users[i], tenants[i], envs[i] = r.id, ledgerID(), c.UserID, c.Tenant, c.Env
		convs[i], models[i], reqIDs[i], periods[i] = c.ConversationID, c.Model, c.RequestID, r.period
		amounts[i], estimates[i] = int64(c.Amount), c.EstimatedTokens
		nows[i], expires[i] = controlstore.Millis(r.now), controlstore.Millis(r.now.Add(s.cfg.ReservationTTL))
	}
	ctx, cancel := context.WithTimeout(context.Background(), reserveBatchTimeout)
	defer cancel()
	rows, err := s.db.SQL.QueryContext(ctx, `SELECT r.outcome, r.limit_nano, r.committed_nano, r.retry_after_ms
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[],
			$10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[]) WITH ORDINALITY
			AS a(id, ledger_id, user_id, tenant, env, conversation, model, request_id, period, amount, estimate, now, expires, ord)
		CROSS JOIN LATERAL talkide_budget_reserve(a.id, a.ledger_id, a.user_id, a.tenant, a.env, a.conversation, a.model,
			a.request_id, a.period, a.amount, a.estimate, $14, a.now, a.expires, $15, $16, $17) r
		ORDER BY a.ord`,
		ids, ledgerIDs, users, tenants, envs, convs, models, reqIDs, periods, amounts, estimates, nows, expires,
		s.cfg.DefaultLimit, window, f.MaxRequests, f.MaxTokens)
	if err != nil {
		return fmt.Errorf("reserve budget: %w", err)
	}
	defer rows.Close()
	for i, o := range ops {
		r := o.reserve
		if !rows.Next() {
			if err := rows.Err(); err != nil {
				return fmt.Errorf("reserve budget: %w", err)
			}
			return fmt.Errorf("reserve budget: %d answers for %d reservations", i, n)
		}
		var retry int64
		if err := rows.Scan(&r.outcome, &r.limit, &r.committed, &retry); err != nil {
			return fmt.Errorf("reserve budget: %w", err)
		}
		r.retryAfter = time.Duration(retry) * time.Millisecond
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("reserve budget: %w", err)
	}
	return rows.Err()
}

// reserveTx is talkide_budget_reserve in Go, for SQLite: the writer
// goroutine is the only writer of budget rows, so the check and the
// reservation cannot interleave with another call's.
func (s *Service) reserveTx(ctx context.Context, tx querier, r *reserveArgs) error {
	c, db := r.call, s.db
	now := controlstore.Millis(r.now)
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE((SELECT limit_nano FROM budget_limits WHERE user_id = ?),
		(SELECT limit_nano FROM budget_tenant_limits WHERE tenant = ?), ?)`, c.UserID, c.Tenant, s.cfg.DefaultLimit).Scan(&r.limit); err != nil {
		return fmt.Errorf("reserve budget: read limit: %w", err)
	}
	var spent, reserved NanoUSD
	err := tx.QueryRowContext(ctx, `SELECT spent_nano, reserved_nano FROM budget_usage WHERE user_id = ? AND period = ?`, c.UserID, r.period).Scan(&spent, &reserved)
	if errors.Is(err, sql.ErrNoRows) {
		_, err = tx.ExecContext(ctx, `INSERT INTO budget_usage (user_id, period) VALUES (?, ?)`, c.UserID, r.period)
	}
	if err != nil {
		return fmt.Errorf("reserve budget: read usage: %w", err)
	}
	r.committed = spent + reserved
	if f := s.cfg.FairUse; f.on() {
		var n, tokens int64
		var oldest sql.NullInt64
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(COALESCE(tokens, tokens_estimate)), 0), MIN(created_at)
			FROM budget_reservations WHERE user_id = ? AND created_at > ?`, c.UserID, now-f.Window.Milliseconds()).Scan(&n, &tokens, &oldest); err != nil {
			return fmt.Errorf("reserve budget: read fair-use window: %w", err)
		}
		retry := time.Duration(oldest.Int64+f.Window.Milliseconds()-now) * time.Millisecond
		switch {
		case f.MaxRequests > 0 && n >= f.MaxRequests:
			r.outcome, r.retryAfter = "fair_use_requests", retry
			return nil
		case f.MaxTokens > 0 && tokens >= f.MaxTokens:
			r.outcome, r.retryAfter = "fair_use_tokens", retry
			return nil
		}
	}
	if r.committed+c.Amount > r.limit {
		r.outcome = "budget"
		return nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE budget_usage SET reserved_nano = reserved_nano + ? WHERE user_id = ? AND period = ?`, c.Amount, c.UserID, r.period); err != nil {
		return fmt.Errorf("reserve budget: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO budget_reservations (id, user_id, period, amount_nano, created_at, expires_at, tenant, tokens_estimate)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, r.id, c.UserID, r.period, c.Amount, now, controlstore.Millis(r.now.Add(s.cfg.ReservationTTL)), c.Tenant, c.EstimatedTokens); err != nil {
		return fmt.Errorf("reserve budget: %w", err)
	}
	if err := insertLedger(ctx, tx, db, ledgerRow{kind: "reserve", at: now, userID: c.UserID, period: r.period, reservation: r.id,
		tenant: c.Tenant, env: c.Env, conversation: c.ConversationID, model: c.Model, requestID: c.RequestID, amount: c.Amount}); err != nil {
		return err
	}
	r.outcome = "ok"
	return nil
}

// settleTx books one settlement: talkide_budget_settle on PostgreSQL, the
// same steps in Go on SQLite.
func (s *Service) settleTx(ctx context.Context, tx querier, a *settleArgs) error {
	res, d, u := a.res, a.debit, a.debit.Usage
	now := controlstore.Millis(a.now)
	cw5, cw1h := ledgerCacheWrites(u)
	tokens := u.TotalTokens()
	if s.db.Dialect == controlstore.Postgres {
		refundID := ledgerID() // ids sort by time: a refund comes before its debit
		err := tx.QueryRowContext(ctx, `SELECT talkide_budget_settle($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)`,
			res.ID, ledgerID(), refundID, res.UserID, res.Tenant, res.Env, d.ConversationID, u.Model, d.RequestID, res.Period,
			a.amount, tokens, u.InputTokens, u.OutputTokens, cw5, cw1h, u.CacheReadInputTokens, d.Outcome, now).Scan(&a.result)
		if err != nil {
			return fmt.Errorf("debit budget: %w", err)
		}
		return nil
	}
	var amount NanoUSD
	var settledAt sql.NullInt64
	period, user := res.Period, res.UserID
	err := tx.QueryRowContext(ctx, `SELECT amount_nano, settled_at, period, user_id FROM budget_reservations WHERE id = ?`, res.ID).Scan(&amount, &settledAt, &period, &user)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if _, err := tx.ExecContext(ctx, `INSERT INTO budget_reservations (id, user_id, period, amount_nano, created_at, expires_at, settled_at, tenant, tokens)
			VALUES (?, ?, ?, 0, ?, ?, ?, ?, ?)`, res.ID, user, period, now, now, now, res.Tenant, tokens); err != nil {
			return fmt.Errorf("debit budget: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO budget_usage (user_id, period, spent_nano) VALUES (?, ?, ?)
			ON CONFLICT (user_id, period) DO UPDATE SET spent_nano = budget_usage.spent_nano + excluded.spent_nano`, user, period, a.amount); err != nil {
			return fmt.Errorf("debit budget: %w", err)
		}
		a.result = "orphan"
	case err != nil:
		return fmt.Errorf("debit budget: reservation %s: %w", res.ID, err)
	case settledAt.Valid && settledAt.Int64 >= 0:
		a.result = "already"
		return nil
	default:
		release, refund := amount, NanoUSD(0)
		a.result = "settled"
		if settledAt.Valid { // expired: its worst case was charged; replace it
			release, refund = 0, amount
			a.result = "expired_settled"
		}
		if _, err := tx.ExecContext(ctx, `UPDATE budget_usage SET reserved_nano = reserved_nano - ?, spent_nano = spent_nano - ? + ? WHERE user_id = ? AND period = ?`,
			release, refund, a.amount, user, period); err != nil {
			return fmt.Errorf("debit budget: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE budget_reservations SET settled_at = ?, tokens = ? WHERE id = ?`, now, tokens, res.ID); err != nil {
			return fmt.Errorf("debit budget: %w", err)
		}
		if refund > 0 {
			if err := insertLedger(ctx, tx, s.db, ledgerRow{kind: "refund", at: now, userID: user, period: period, reservation: res.ID,
				tenant: res.Tenant, env: res.Env, conversation: d.ConversationID, model: u.Model, requestID: d.RequestID,
				amount: refund, outcome: "expired_charge_replaced"}); err != nil {
				return err
			}
		}
	}
	return insertLedger(ctx, tx, s.db, ledgerRow{kind: "debit", at: now, userID: user, period: period, reservation: res.ID,
		tenant: res.Tenant, env: res.Env, conversation: d.ConversationID, model: u.Model, requestID: d.RequestID,
		input: u.InputTokens, output: u.OutputTokens, cw5m: cw5, cw1h: cw1h, cacheRead: u.CacheReadInputTokens,
		amount: a.amount, outcome: d.Outcome})
}

// ledgerCacheWrites splits cache writes as they were priced: the 5-minute
// writes, and everything else at the 1-hour rate.
func ledgerCacheWrites(u anthropic.Usage) (cw5m, cw1h int64) {
	cw5m = max(u.CacheCreation5m, 0)
	return cw5m, max(u.CacheCreationInputTokens, cw5m+max(u.CacheCreation1h, 0)) - cw5m
}

// maxExpirePerSweep bounds the work of one sweep.
const maxExpirePerSweep = 500

// expireTx charges every reservation past its expiry in full: reserved
// becomes spent, with an "expire" ledger entry.
func (s *Service) expireTx(ctx context.Context, tx querier, a *expireArgs) error {
	db := s.db
	now := controlstore.Millis(a.now)
	rows, err := tx.QueryContext(ctx, db.Q(`SELECT id, user_id, period, amount_nano, tenant FROM budget_reservations
		WHERE settled_at IS NULL AND expires_at < ? ORDER BY expires_at LIMIT `+fmt.Sprint(maxExpirePerSweep)), now)
	if err != nil {
		return fmt.Errorf("expire reservations: %w", err)
	}
	var stale []Reservation
	for rows.Next() {
		var r Reservation
		if err := rows.Scan(&r.ID, &r.UserID, &r.Period, &r.Amount, &r.Tenant); err != nil {
			rows.Close()
			return fmt.Errorf("expire reservations: %w", err)
		}
		stale = append(stale, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("expire reservations: %w", err)
	}
	// Usage rows locked in user order, as every batch does (see byUser).
	slices.SortFunc(stale, func(a, b Reservation) int { return strings.Compare(a.UserID, b.UserID) })
	for _, r := range stale {
		res, err := tx.ExecContext(ctx, db.Q(`UPDATE budget_reservations SET settled_at = ? WHERE id = ? AND settled_at IS NULL`), -now, r.ID)
		if err != nil {
			return fmt.Errorf("expire reservations: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			continue // settled meanwhile (PostgreSQL: by another replica)
		}
		if _, err := tx.ExecContext(ctx, db.Q(`UPDATE budget_usage SET reserved_nano = reserved_nano - ?, spent_nano = spent_nano + ? WHERE user_id = ? AND period = ?`),
			r.Amount, r.Amount, r.UserID, r.Period); err != nil {
			return fmt.Errorf("expire reservations: %w", err)
		}
		if err := insertLedger(ctx, tx, db, ledgerRow{kind: "expire", at: now, userID: r.UserID, period: r.Period, reservation: r.ID,
			tenant: r.Tenant, amount: r.Amount, outcome: "never_settled"}); err != nil {
			return err
		}
		a.expired++
	}
	return nil
}

// ExpireReservations charges every reservation whose TTL has passed (see
// Config.ReservationTTL) and returns how many it charged. The writer also
// does this on its own every quarter TTL (at most every minute).
func (s *Service) ExpireReservations(ctx context.Context) (int, error) {
	a := &expireArgs{now: s.now()}
	err := s.run(ctx, &op{expire: a})
	return a.expired, err
}

type ledgerRow struct {
	kind, userID, period, reservation, tenant, env, conversation, model, requestID, outcome string
	at                                                                                      int64
	input, output, cw5m, cw1h, cacheRead                                                    int64
	amount                                                                                  NanoUSD
}

// ledgerID returns a new ledger entry id: a UUIDv7, so ids sort by time.
func ledgerID() string { return uuid.Must(uuid.NewV7()).String() }

func insertLedger(ctx context.Context, tx querier, db *controlstore.DB, r ledgerRow) error {
	_, err := tx.ExecContext(ctx, db.Q(`INSERT INTO budget_ledger (id, created_at, kind, user_id, period, reservation_id,
		conversation_id, model, request_id, input_tokens, output_tokens, cache_write_5m, cache_write_1h, cache_read, amount_nano,
		tenant, env, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		ledgerID(), r.at, r.kind, r.userID, r.period, r.reservation, r.conversation, r.model, r.requestID,
		r.input, r.output, r.cw5m, r.cw1h, r.cacheRead, r.amount, r.tenant, r.env, r.outcome)
	if err != nil {
		return fmt.Errorf("write budget ledger: %w", err)
	}
	return nil
}
