package budget

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/token"
)

// CommitDelay is how long a predicted reservation waits, by default
// (Config.CommitDelay), before its commit starts, unless Ticket.Begin
// starts it sooner: long enough for the gateway to have forwarded the call
// (a commit started at once competed with the forwarding for the CPU:
// measured, docs/benchmarks.md), and for the reservations of calls arriving
// meanwhile to join the same batch; far shorter than any upstream takes to
// answer.
const CommitDelay = 2 * time.Millisecond

// viewTTL is how long a user's view predicts without a new database answer.
const viewTTL = 30 * time.Second

// Ticket is a pre-call check under way (PreCallCheckAsync).
type Ticket struct {
	// Predicted reports that the service expects the check to admit the
	// call and is committing the reservation in the background. When
	// false, the check has already ended: Done is closed.
	Predicted bool
	done      chan struct{}
	res       Reservation
	err       error
	// begin starts the commit now instead of after CommitDelay; nil for
	// a ticket that is not committing.
	begin func()
}

// Begin starts a Predicted ticket's commit at once rather than after
// CommitDelay: the gateway calls it when the upstream's answer has come,
// since there is no forwarding left to overlap with. Safe to call more than
// once, and on any ticket.
func (t *Ticket) Begin() {
	if t.begin != nil {
		t.begin()
	}
}

// Decided returns a ticket that has already ended with res and err; for
// budgets that decide at once (tests, benchmarks).
func Decided(res Reservation, err error) *Ticket {
	t := &Ticket{done: make(chan struct{}), res: res, err: err}
	close(t.done)
	return t
}

// NewPendingTicket returns a Predicted ticket and the function that ends it
// with a reservation or an error; for budgets other than Service (test
// doubles of the gateway's Budget). end must be called once.
func NewPendingTicket() (*Ticket, func(Reservation, error)) {
	t := &Ticket{Predicted: true, done: make(chan struct{})}
	return t, func(res Reservation, err error) {
		t.res, t.err = res, err
		close(t.done)
	}
}

// Done is closed when the check has ended and its reservation is durable
// (or it was refused, or failed).
func (t *Ticket) Done() <-chan struct{} { return t.done }

// Result blocks until Done and returns what PreCallCheck would have: the
// reservation, or a *DenyError, a *FairUseError or a database error.
func (t *Ticket) Result() (Reservation, error) {
	<-t.done
	return t.res, t.err
}

// PreCallCheckAsync is PreCallCheck without waiting for the database when
// the outcome can be predicted (see "Pipelined pre-call checks" in the
// package doc): it returns a Ticket with Predicted set, whose reservation
// commits on another goroutine, even if ctx ends (the caller is about to
// spend). Otherwise it runs PreCallCheck on the caller's goroutine, with
// ctx, and returns the ended ticket.
func (s *Service) PreCallCheckAsync(ctx context.Context, c Call) *Ticket {
	exact := func() *Ticket {
		s.cfg.Metrics.observePrediction("exact")
		return Decided(s.PreCallCheck(ctx, c))
	}
	if c.Amount < 0 || c.UserID == "" || s.cfg.NoPrediction {
		return exact()
	}
	c.Amount = min(c.Amount, MaxCost)
	now := s.now()
	period := s.cfg.Period.Key(now)
	v := s.view(ctx, c, period, now)
	if v == nil {
		return exact()
	}
	o := &op{reserve: &reserveArgs{call: c, id: token.NewID(), period: period, now: now}, predicted: true}
	// Predicted and queued in one step under the view's lock, so that a
	// call of this user decided after it (and queued after it) is
	// committed after it: a call admitted on a prediction is never refused
	// because a later call of this process took its budget.
	v.mu.Lock()
	predicted := v.predict(c, now, s.cfg.FairUse)
	var err error
	if predicted {
		if err = s.enqueue(context.WithoutCancel(ctx), o); err != nil {
			v.unpredict(c)
		}
	}
	v.mu.Unlock()
	if !predicted {
		return exact()
	}
	if err != nil {
		return Decided(Reservation{}, err)
	}
	s.cfg.Metrics.observePrediction("predicted")
	t := &Ticket{Predicted: true, done: make(chan struct{})}
	// The op is queued: a leader of later reservations may commit it
	// before the commit starts here; this then only collects the result.
	commit := func() {
		defer close(t.done)
		t.res, t.err = s.awaitReserve(o)
		if t.err != nil {
			s.cfg.Metrics.observePrediction("refused")
		}
	}
	var once sync.Once
	timer := time.AfterFunc(s.cfg.CommitDelay, func() { once.Do(commit) })
	t.begin = func() {
		once.Do(func() {
			timer.Stop()
			go commit()
		})
	}
	return t
}

// userKey names a view: a user's budget in a period.
type userKey struct{ user, period string }

// userView is what the service knows of one user's budget in a period (see
// "Pipelined pre-call checks" in the package doc). Guarded by mu.
type userView struct {
	mu sync.Mutex
	// limit and committed (spent + reserved) are from the last database
	// answer (applied by the leader in commit order, so never an older
	// one after a newer), committed including that answer's own
	// reservation. limit is the one of calls through tenant; a call
	// through another tenant, whose limit may differ, is not predicted.
	limit     NanoUSD
	committed NanoUSD
	tenant    string
	at        time.Time
	// unanswered, unansweredRequests and unansweredTokens are the worst
	// case, the number and the estimated tokens of calls admitted on a
	// prediction whose reservation the database has not answered yet.
	unanswered         NanoUSD
	unansweredRequests int64
	unansweredTokens   int64
	// refusedUntil: no prediction before this time (a refusal was seen).
	refusedUntil time.Time
	// baseRequests and baseTokens are the fair-use window's counts when
	// the view was loaded (calls made before, or elsewhere), counted
	// until baseUntil; recent are the calls admitted since.
	baseRequests, baseTokens int64
	baseUntil                time.Time
	recent                   []admitted
}

type admitted struct {
	at     time.Time
	tokens int64
}

// view returns the user's view, loading it when the service has none or
// only a stale one; nil when it cannot be loaded (the exact path then
// reports the error).
func (s *Service) view(ctx context.Context, c Call, period string, now time.Time) *userView {
	k := userKey{c.UserID, period}
	v, known := s.views.Load(k)
	if known {
		uv := v.(*userView)
		uv.mu.Lock()
		fresh := now.Sub(uv.at) < viewTTL
		uv.mu.Unlock()
		if fresh {
			return uv
		}
	}
	nv, err := s.loadView(ctx, c, period, now)
	if err != nil {
		s.log.Debug("load budget view", "user", c.UserID, "err", err)
		return nil
	}
	if !known {
		v, _ = s.views.LoadOrStore(k, nv) // a concurrent first call may have stored one
		return v.(*userView)
	}
	// Refreshed in place, unless an answer came meanwhile: the calls
	// admitted on it are still unanswered.
	uv := v.(*userView)
	uv.mu.Lock()
	if uv.at.Before(nv.at) {
		uv.limit, uv.committed, uv.tenant, uv.at = nv.limit, nv.committed, nv.tenant, nv.at
		uv.baseRequests, uv.baseTokens, uv.baseUntil, uv.recent = nv.baseRequests, nv.baseTokens, nv.baseUntil, nil
	}
	uv.mu.Unlock()
	return uv
}

// loadView reads a user's limit, committed spend and fair-use window in one
// query, without writing or locking anything.
func (s *Service) loadView(ctx context.Context, c Call, period string, now time.Time) (*userView, error) {
	st, err := s.viewQuery(ctx)
	if err != nil {
		return nil, fmt.Errorf("load budget view: %w", err)
	}
	f := s.cfg.FairUse
	var window int64
	if f.on() {
		window = f.Window.Milliseconds()
	}
	uv := &userView{at: now, tenant: c.Tenant, baseUntil: now.Add(f.Window)}
	if err := st.QueryRowContext(ctx, c.UserID, c.Tenant, s.cfg.DefaultLimit, c.UserID, period, window,
		c.UserID, controlstore.Millis(now)-window).Scan(&uv.limit, &uv.committed, &uv.baseRequests, &uv.baseTokens); err != nil {
		return nil, fmt.Errorf("load budget view: %w", err)
	}
	return uv, nil
}

// viewQuery returns loadView's statement, prepared once (parsing it anew
// cost more than running it). Its fair-use part reads nothing when the
// window (the sixth argument) is zero.
func (s *Service) viewQuery(ctx context.Context) (*sql.Stmt, error) {
	s.viewMu.Lock()
	defer s.viewMu.Unlock()
	if s.viewStmt != nil {
		return s.viewStmt, nil
	}
	st, err := s.db.SQL.PrepareContext(ctx, s.db.Q(`SELECT
		COALESCE((SELECT limit_nano FROM budget_limits WHERE user_id = ?),
			(SELECT limit_nano FROM budget_tenant_limits WHERE tenant = ?), ?),
		COALESCE((SELECT spent_nano + reserved_nano FROM budget_usage WHERE user_id = ? AND period = ?), 0),
		w.n, w.tokens
		FROM (SELECT COUNT(*) AS n, COALESCE(SUM(COALESCE(tokens, tokens_estimate)), 0) AS tokens
			FROM budget_reservations WHERE ? > 0 AND user_id = ? AND created_at > ?) w`))
	if err != nil {
		return nil, err
	}
	s.viewStmt = st
	return st, nil
}

// predict decides whether c is admitted on prediction and, if so, counts
// it as unanswered. v.mu is held.
func (v *userView) predict(c Call, now time.Time, f FairUse) bool {
	if now.Before(v.refusedUntil) || now.Sub(v.at) >= viewTTL || c.Tenant != v.tenant {
		return false
	}
	if v.committed+v.unanswered+2*c.Amount > v.limit {
		return false
	}
	if f.on() {
		v.prune(now, f.Window)
		n, tokens := int64(len(v.recent))+v.unansweredRequests, c.EstimatedTokens+v.unansweredTokens
		for _, a := range v.recent {
			tokens += a.tokens
		}
		if now.Before(v.baseUntil) {
			n, tokens = n+v.baseRequests, tokens+v.baseTokens
		}
		// Well below the limits: three quarters, leaving room for calls
		// made through other replicas meanwhile.
		if f.MaxRequests > 0 && 4*(n+1) > 3*f.MaxRequests {
			return false
		}
		if f.MaxTokens > 0 && 4*tokens > 3*f.MaxTokens {
			return false
		}
	}
	v.unanswered += c.Amount
	v.unansweredRequests++
	v.unansweredTokens += c.EstimatedTokens
	return true
}

// unpredict takes back predict's count of c. v.mu is held.
func (v *userView) unpredict(c Call) {
	v.unanswered = max(v.unanswered-c.Amount, 0)
	v.unansweredRequests = max(v.unansweredRequests-1, 0)
	v.unansweredTokens = max(v.unansweredTokens-c.EstimatedTokens, 0)
}

// prune drops admissions older than the fair-use window. v.mu is held.
func (v *userView) prune(now time.Time, window time.Duration) {
	i := 0
	for i < len(v.recent) && now.Sub(v.recent[i].at) >= window {
		i++
	}
	v.recent = v.recent[i:]
}

// answered records the database's answer to a reservation: r holds the
// limit and the committed spend before it (a negative limit: unknown).
// predicted says the call was counted as unanswered. The batch's leader
// calls it, in commit order.
func (s *Service) answered(r *reserveArgs, predicted bool, err error) {
	k := userKey{r.call.UserID, r.period}
	v, ok := s.views.Load(k)
	if !ok {
		if err != nil || r.outcome == "" || r.limit < 0 {
			return
		}
		// A user seen first on the exact path: its answer is a view.
		v, _ = s.views.LoadOrStore(k, &userView{tenant: r.call.Tenant})
	}
	uv := v.(*userView)
	uv.mu.Lock()
	defer uv.mu.Unlock()
	if predicted {
		uv.unpredict(r.call)
	}
	if err != nil || r.outcome == "" {
		return
	}
	if r.outcome == "ok" && s.cfg.FairUse.on() {
		uv.recent = append(uv.recent, admitted{at: r.now, tokens: r.call.EstimatedTokens})
	}
	if r.limit < 0 {
		uv.committed += r.call.Amount // admitted; the rest of the answer was lost
		return
	}
	uv.limit, uv.committed, uv.tenant = r.limit, r.committed, r.call.Tenant
	if r.now.After(uv.at) {
		uv.at = r.now
	}
	switch r.outcome {
	case "ok":
		uv.committed += r.call.Amount
	case "budget":
		uv.refusedUntil = r.now.Add(max(s.cfg.FairUse.Window, time.Minute))
	default:
		uv.refusedUntil = r.now.Add(max(r.retryAfter, time.Second))
	}
}

// forgetViews drops every view: a limit changed, so the next call of each
// user reads the new one.
func (s *Service) forgetViews() { s.views.Clear() }

// evictViews drops the views nobody used for viewTTL (they would be
// reloaded anyway), so memory follows the active users. The writer calls it
// with every expiry sweep.
func (s *Service) evictViews(now time.Time) {
	s.views.Range(func(k, v any) bool {
		uv := v.(*userView)
		uv.mu.Lock()
		idle := now.Sub(uv.at) >= viewTTL && uv.unansweredRequests == 0
		uv.mu.Unlock()
		if idle {
			s.views.CompareAndDelete(k, v)
		}
		return true
	})
}
