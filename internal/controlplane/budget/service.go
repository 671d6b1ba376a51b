package budget

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
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
	// Resets is when Period ends and the user's spending starts again
	// from zero (PeriodKind.End of the call's time).
	Resets time.Time
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

// End returns when the period that contains t ends (the next one starts),
// in UTC: the next day, Monday or first of the month at 00:00.
func (k PeriodKind) End(t time.Time) time.Time {
	t = t.UTC()
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	switch k {
	case Daily:
		return day.AddDate(0, 0, 1)
	case Weekly:
		return day.AddDate(0, 0, 7-(int(day.Weekday())+6)%7)
	}
	return time.Date(t.Year(), t.Month()+1, 1, 0, 0, 0, 0, time.UTC)
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
	// "Pipelined pre-call checks" in the package doc for what prediction
	// trades).
	NoPrediction bool
	// CommitDelay is how long a predicted reservation waits before its
	// commit starts, unless Ticket.Begin starts it earlier. Default
	// CommitDelay (the constant).
	CommitDelay time.Duration
	// Now is the service's clock: it decides a call's period, reservation
	// expiry and fair-use window. Default time.Now.
	Now func() time.Time
}

// Service is the UserBudgetService over the control-plane database
// (SQLite or PostgreSQL); see the package doc for how its writes are
// scheduled and committed, and for PreCallCheckAsync's pipelining. Safe for
// concurrent use. Close stops it.
type Service struct {
	db  *controlstore.DB
	cfg Config
	log *slog.Logger

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
	// dirty is set after each commit on the writer's connection (by the
	// writer goroutine or a leading caller), cleared by the syncer
	// before it fsyncs the log.
	dirty    atomic.Bool
	syncDone chan struct{}
	// w is the writer's connection (nil until first used, and after a
	// failure); only the holder of conn touches it.
	w    *writerConn
	quit chan struct{}
	done chan struct{}
	// mu guards closed: enqueuers hold it shared so Close can wait for them.
	mu     sync.RWMutex
	closed bool
	// views are the active users' budgets as last seen (pipeline.go, and
	// "Pipelined pre-call checks" in the package doc):
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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Service{db: db, cfg: cfg, log: cfg.Logger,
		ops: make(chan *op, 1024), conn: make(chan struct{}, 1), pgLeader: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
		syncDone: make(chan struct{})}
	go s.writer()
	go s.syncer()
	return s
}

func (s *Service) now() time.Time { return s.cfg.Now() }

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
	o := &op{reserve: &reserveArgs{call: c, id: token.NewID(), period: s.cfg.Period.Key(now), resets: s.cfg.Period.End(now), now: now}}
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
	// resets is when period ends.
	resets time.Time
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
		return &DenyError{UserID: r.call.UserID, Period: r.period, Limit: r.limit, Committed: r.committed, Needed: r.call.Amount, Resets: r.resets}
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

// op is one budget write: a reservation (committed by a leading caller,
// see lead), a settlement or an expiry sweep (committed by the writer
// goroutine).
type op struct {
	ctx     context.Context
	reserve *reserveArgs
	settle  *settleArgs
	expire  *expireArgs
	done    chan error
	// predicted marks a reservation admitted on a prediction.
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

// ExpireReservations charges every reservation whose TTL has passed (see
// Config.ReservationTTL) and returns how many it charged. The writer also
// does this on its own every quarter TTL (at most every minute).
func (s *Service) ExpireReservations(ctx context.Context) (int, error) {
	a := &expireArgs{now: s.now()}
	err := s.run(ctx, &op{expire: a})
	return a.expired, err
}
