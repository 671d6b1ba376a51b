package reporting

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
)

// Scope is who a report comes from, taken from its WorkerToken.
type Scope struct {
	Tenant, Env, Conversation, User string
}

// Errors returned by Store methods.
var (
	// ErrNotFound: the issue does not exist in the tenant-env.
	ErrNotFound = errors.New("not found")
	// ErrKeyReused: an idempotency key was used before for another report
	// (another kind, or another body).
	ErrKeyReused = errors.New("idempotency key reused for another report")
)

// Store keeps reports in the control-plane database (the tables of
// migration 00020). It works on SQLite and PostgreSQL alike.
type Store struct {
	db  *controlstore.DB
	now func() time.Time
}

// NewStore returns the store over db.
func NewStore(db *controlstore.DB) *Store {
	return &Store{db: db, now: time.Now}
}

// BodyHash returns the hash stored with a receipt: what the request was
// (path and body), so a key reused for something else is caught.
func BodyHash(path string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(path))
	h.Write([]byte{0})
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// once runs apply in a transaction guarded by the receipt of (scope, key):
// the first call stores apply's answer with the receipt and returns it; any
// later call with the same key returns the stored answer with dup set,
// without running apply. kind and hash must match the first call's, else
// ErrKeyReused.
func (s *Store) once(ctx context.Context, sc Scope, key, kind, hash string, apply func(tx execer) (any, error)) (json.RawMessage, bool, error) {
	tx, err := s.db.SQL.BeginTx(ctx, nil)
	if err != nil {
		return nil, false, fmt.Errorf("store %s report: %w", kind, err)
	}
	defer tx.Rollback()
	raw, dup, err := s.onceIn(ctx, tx, sc, key, kind, hash, apply)
	if err != nil || dup {
		return raw, dup, err
	}
	if err := tx.Commit(); err != nil {
		return nil, false, fmt.Errorf("store %s report: %w", kind, err)
	}
	return raw, false, nil
}

// execer runs a transaction's statements: the *sql.Tx, or a
// controlstore.Stmts over it (a batch repeats the same few statements for
// every report).
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	queryer
}

// onceIn is once inside the caller's transaction tx, which it neither
// commits nor rolls back. ErrKeyReused leaves tx usable; any other error
// may not (PostgreSQL aborts a transaction at a failed statement).
func (s *Store) onceIn(ctx context.Context, tx execer, sc Scope, key, kind, hash string, apply func(ex execer) (any, error)) (json.RawMessage, bool, error) {
	q := s.db.Q
	// A tool event, usage or activity report is answered with its key
	// alone: its receipt is written whole at once, with no update after.
	var known []byte
	switch kind {
	case contract.ReportKindToolEvent, contract.ReportKindUsage, contract.ReportKindActivity:
		known, _ = json.Marshal(contract.ReportAck{IdempotencyKey: key}) // a struct of strings: cannot fail
	}
	// Concurrent deliveries of one key: on PostgreSQL the second INSERT
	// waits for the first transaction and then inserts nothing; SQLite
	// serialises write transactions.
	res, err := tx.ExecContext(ctx, q(`INSERT INTO report_receipts (tenant, env, conversation_id, idempotency_key, kind, body_sha256, response, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`), sc.Tenant, sc.Env, sc.Conversation, key, kind, hash, string(known), controlstore.Millis(s.now()))
	if err != nil {
		return nil, false, fmt.Errorf("store %s report: %w", kind, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		var gotKind, gotHash, resp string
		err := tx.QueryRowContext(ctx, q(`SELECT kind, body_sha256, response FROM report_receipts
			WHERE tenant = ? AND env = ? AND conversation_id = ? AND idempotency_key = ?`), sc.Tenant, sc.Env, sc.Conversation, key).Scan(&gotKind, &gotHash, &resp)
		if err != nil {
			return nil, false, fmt.Errorf("read %s report receipt: %w", kind, err)
		}
		if gotKind != kind || gotHash != hash {
			return nil, false, fmt.Errorf("%w: key %q", ErrKeyReused, key)
		}
		return json.RawMessage(resp), true, nil
	}
	ans, err := apply(tx)
	if err != nil {
		return nil, false, err
	}
	if known != nil {
		return known, false, nil
	}
	b, err := json.Marshal(ans)
	if err != nil {
		return nil, false, fmt.Errorf("store %s report: %w", kind, err)
	}
	if _, err := tx.ExecContext(ctx, q(`UPDATE report_receipts SET response = ? WHERE tenant = ? AND env = ? AND conversation_id = ? AND idempotency_key = ?`),
		string(b), sc.Tenant, sc.Env, sc.Conversation, key); err != nil {
		return nil, false, fmt.Errorf("store %s report: %w", kind, err)
	}
	return b, false, nil
}

func decodeAck(raw json.RawMessage, dup bool) (contract.ReportAck, error) {
	var a contract.ReportAck
	if err := json.Unmarshal(raw, &a); err != nil {
		return a, fmt.Errorf("decode stored answer: %w", err)
	}
	a.Duplicate = dup
	return a, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// RecordToolEvent stores a tool event report (r must have passed Validate).
func (s *Store) RecordToolEvent(ctx context.Context, sc Scope, r contract.ToolEventReport, hash string) (contract.ReportAck, error) {
	raw, dup, err := s.once(ctx, sc, r.IdempotencyKey, contract.ReportKindToolEvent, hash, s.applyToolEvent(ctx, sc, r))
	if err != nil {
		return contract.ReportAck{}, err
	}
	return decodeAck(raw, dup)
}

func (s *Store) applyToolEvent(ctx context.Context, sc Scope, r contract.ToolEventReport) func(tx execer) (any, error) {
	return func(tx execer) (any, error) {
		q := s.db.Q
		at := controlstore.Millis(r.Time)
		var err error
		if r.Phase == contract.ToolPhaseUse {
			_, err = tx.ExecContext(ctx, q(`INSERT INTO tool_calls (conversation_id, tool_use_id, tenant, env, name, input, first_event_id, started_at)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?)
				ON CONFLICT (conversation_id, tool_use_id) DO UPDATE SET name = excluded.name, input = excluded.input,
					started_at = excluded.started_at,
					first_event_id = CASE WHEN excluded.first_event_id < tool_calls.first_event_id THEN excluded.first_event_id ELSE tool_calls.first_event_id END`),
				sc.Conversation, r.ToolUseID, sc.Tenant, sc.Env, r.Name, string(r.Input), r.EventID, at)
		} else {
			_, err = tx.ExecContext(ctx, q(`INSERT INTO tool_calls (conversation_id, tool_use_id, tenant, env, output, is_error, has_result, first_event_id, finished_at)
				VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?)
				ON CONFLICT (conversation_id, tool_use_id) DO UPDATE SET output = excluded.output, is_error = excluded.is_error,
					has_result = 1, finished_at = excluded.finished_at`),
				sc.Conversation, r.ToolUseID, sc.Tenant, sc.Env, r.Output, boolInt(r.IsError), r.EventID, at)
		}
		if err != nil {
			return nil, fmt.Errorf("store tool event: %w", err)
		}
		return contract.ReportAck{IdempotencyKey: r.IdempotencyKey}, nil
	}
}

// RecordUsage stores a usage report (r must have passed Validate).
func (s *Store) RecordUsage(ctx context.Context, sc Scope, r contract.UsageReport, hash string) (contract.ReportAck, error) {
	raw, dup, err := s.once(ctx, sc, r.IdempotencyKey, contract.ReportKindUsage, hash, s.applyUsage(ctx, sc, r))
	if err != nil {
		return contract.ReportAck{}, err
	}
	return decodeAck(raw, dup)
}

// applyUsage stores nothing when the turn's usage row exists (a receipt
// lost, the report's event already booked): a turn is counted once.
func (s *Store) applyUsage(ctx context.Context, sc Scope, r contract.UsageReport) func(tx execer) (any, error) {
	return func(tx execer) (any, error) {
		u := r.Usage
		_, err := tx.ExecContext(ctx, s.db.Q(`INSERT INTO turn_usage (conversation_id, event_id, tenant, env, user_id, client_message_id, outcome,
				input_tokens, output_tokens, cache_write_tokens, cache_read_tokens, cost_nano, num_turns, duration_ms, at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (conversation_id, event_id) DO NOTHING`),
			sc.Conversation, r.EventID, sc.Tenant, sc.Env, sc.User, r.ClientMessageID, r.Outcome,
			u.InputTokens, u.OutputTokens, u.CacheCreationInputTokens, u.CacheReadInputTokens, r.CostNanoUSD, r.NumTurns, r.DurationMS, controlstore.Millis(r.Time))
		if err != nil {
			return nil, fmt.Errorf("store usage: %w", err)
		}
		return contract.ReportAck{IdempotencyKey: r.IdempotencyKey}, nil
	}
}

// RecordActivity stores an activity report (r must have passed Validate).
func (s *Store) RecordActivity(ctx context.Context, sc Scope, r contract.ActivityReport, hash string) (contract.ReportAck, error) {
	raw, dup, err := s.once(ctx, sc, r.IdempotencyKey, contract.ReportKindActivity, hash, s.applyActivity(ctx, sc, r))
	if err != nil {
		return contract.ReportAck{}, err
	}
	return decodeAck(raw, dup)
}

// applyActivity stores nothing when the event's entry exists (a receipt
// lost): an event has one entry.
func (s *Store) applyActivity(ctx context.Context, sc Scope, r contract.ActivityReport) func(tx execer) (any, error) {
	return func(tx execer) (any, error) {
		_, err := tx.ExecContext(ctx, s.db.Q(`INSERT INTO activity_log (conversation_id, event_id, tenant, env, type, summary, at, received_at, ref)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (conversation_id, event_id) DO NOTHING`),
			sc.Conversation, r.EventID, sc.Tenant, sc.Env, string(r.Type), r.Summary, controlstore.Millis(r.Time), controlstore.Millis(s.now()), r.Ref)
		if err != nil {
			return nil, fmt.Errorf("store activity: %w", err)
		}
		return contract.ReportAck{IdempotencyKey: r.IdempotencyKey}, nil
	}
}

// BatchItem is one valid report of a batch with the scope of its group's
// WorkerToken and its receipt hash (BodyHash of the kind's path and the
// report's bytes). Exactly one of ToolEvent, Usage and Activity is set.
type BatchItem struct {
	Scope     Scope
	Hash      string
	ToolEvent *contract.ToolEventReport
	Usage     *contract.UsageReport
	Activity  *contract.ActivityReport
}

// BatchResult is how one BatchItem ended: stored (Duplicate when stored
// before), or Err: ErrKeyReused (for good), or another error when the item
// could not be stored now (worth retrying).
type BatchResult struct {
	Duplicate bool
	Err       error
}

// RecordBatch stores items in one transaction, each once (as
// RecordToolEvent, RecordUsage and RecordActivity do). If that transaction
// fails, each item is stored in its own, so one that cannot be stored holds
// back only itself: its result carries the error. The error return is for
// a cancelled ctx only.
func (s *Store) RecordBatch(ctx context.Context, items []BatchItem) ([]BatchResult, error) {
	res, err := s.recordTogether(ctx, items)
	if err == nil {
		return res, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	res = make([]BatchResult, len(items))
	for i, it := range items {
		key, kind, apply := s.batchApply(ctx, it)
		_, dup, err := s.once(ctx, it.Scope, key, kind, it.Hash, apply)
		res[i] = BatchResult{Duplicate: dup, Err: err}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return res, nil
}

func (s *Store) recordTogether(ctx context.Context, items []BatchItem) ([]BatchResult, error) {
	tx, err := s.db.SQL.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("store report batch: %w", err)
	}
	defer tx.Rollback()
	stmts := controlstore.NewStmts(tx)
	res := make([]BatchResult, len(items))
	for i, it := range items {
		key, kind, apply := s.batchApply(ctx, it)
		_, dup, err := s.onceIn(ctx, stmts, it.Scope, key, kind, it.Hash, apply)
		switch {
		case errors.Is(err, ErrKeyReused):
			res[i].Err = err
		case err != nil:
			return nil, err
		default:
			res[i].Duplicate = dup
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("store report batch: %w", err)
	}
	return res, nil
}

func (s *Store) batchApply(ctx context.Context, it BatchItem) (key, kind string, apply func(ex execer) (any, error)) {
	switch {
	case it.ToolEvent != nil:
		return it.ToolEvent.IdempotencyKey, contract.ReportKindToolEvent, s.applyToolEvent(ctx, it.Scope, *it.ToolEvent)
	case it.Usage != nil:
		return it.Usage.IdempotencyKey, contract.ReportKindUsage, s.applyUsage(ctx, it.Scope, *it.Usage)
	default:
		return it.Activity.IdempotencyKey, contract.ReportKindActivity, s.applyActivity(ctx, it.Scope, *it.Activity)
	}
}

func decodeIssueAck(raw json.RawMessage, dup bool) (contract.IssueAck, error) {
	var a contract.IssueAck
	if err := json.Unmarshal(raw, &a); err != nil {
		return a, fmt.Errorf("decode stored answer: %w", err)
	}
	a.Duplicate = dup
	return a, nil
}

// CreateIssue files an issue in the scope's tenant-env with the next number.
func (s *Store) CreateIssue(ctx context.Context, sc Scope, c contract.IssueCreate, hash string) (contract.IssueAck, error) {
	raw, dup, err := s.once(ctx, sc, c.IdempotencyKey, "issue_create", hash, func(tx execer) (any, error) {
		q := s.db.Q
		// The counter row serialises numbering: UPDATE takes its row lock
		// on PostgreSQL; SQLite serialises write transactions anyway.
		if _, err := tx.ExecContext(ctx, q(`INSERT INTO issue_counters (tenant, env, last_number) VALUES (?, ?, 0) ON CONFLICT DO NOTHING`), sc.Tenant, sc.Env); err != nil {
			return nil, fmt.Errorf("create issue: %w", err)
		}
		if _, err := tx.ExecContext(ctx, q(`UPDATE issue_counters SET last_number = last_number + 1 WHERE tenant = ? AND env = ?`), sc.Tenant, sc.Env); err != nil {
			return nil, fmt.Errorf("create issue: %w", err)
		}
		var n int64
		if err := tx.QueryRowContext(ctx, q(`SELECT last_number FROM issue_counters WHERE tenant = ? AND env = ?`), sc.Tenant, sc.Env).Scan(&n); err != nil {
			return nil, fmt.Errorf("create issue: %w", err)
		}
		now := s.now().UTC().Truncate(time.Millisecond)
		is := contract.Issue{Number: n, Tenant: sc.Tenant, Env: sc.Env, Title: c.Title, Body: c.Body, State: contract.IssueOpen,
			ConversationID: sc.Conversation, UserID: sc.User, CreatedAt: now, UpdatedAt: now}
		if _, err := tx.ExecContext(ctx, q(`INSERT INTO issues (tenant, env, number, title, body, state, conversation_id, user_id, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`), is.Tenant, is.Env, is.Number, is.Title, is.Body, is.State, is.ConversationID, is.UserID,
			controlstore.Millis(now), controlstore.Millis(now)); err != nil {
			return nil, fmt.Errorf("create issue: %w", err)
		}
		return contract.IssueAck{IdempotencyKey: c.IdempotencyKey, Issue: is}, nil
	})
	if err != nil {
		return contract.IssueAck{}, err
	}
	return decodeIssueAck(raw, dup)
}

// UpdateIssue changes issue number of the scope's tenant-env. It returns
// ErrNotFound for an issue that does not exist there.
func (s *Store) UpdateIssue(ctx context.Context, sc Scope, number int64, u contract.IssueUpdate, hash string) (contract.IssueAck, error) {
	raw, dup, err := s.once(ctx, sc, u.IdempotencyKey, "issue_update", hash, func(tx execer) (any, error) {
		q := s.db.Q
		now := controlstore.Millis(s.now())
		res, err := tx.ExecContext(ctx, q(`UPDATE issues SET
				title = COALESCE(?, title), body = COALESCE(?, body), state = COALESCE(?, state), updated_at = ?
			WHERE tenant = ? AND env = ? AND number = ?`),
			nullString(u.Title), nullString(u.Body), nullString(u.State), now, sc.Tenant, sc.Env, number)
		if err != nil {
			return nil, fmt.Errorf("update issue: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return nil, ErrNotFound
		}
		is, err := s.issue(ctx, tx, sc.Tenant, sc.Env, number, false)
		if err != nil {
			return nil, err
		}
		return contract.IssueAck{IdempotencyKey: u.IdempotencyKey, Issue: is}, nil
	})
	if err != nil {
		return contract.IssueAck{}, err
	}
	return decodeIssueAck(raw, dup)
}

// CommentIssue adds a comment to issue number of the scope's tenant-env. It
// returns ErrNotFound for an issue that does not exist there.
func (s *Store) CommentIssue(ctx context.Context, sc Scope, number int64, c contract.IssueComment, hash string) (contract.IssueAck, error) {
	raw, dup, err := s.once(ctx, sc, c.IdempotencyKey, "issue_comment", hash, func(tx execer) (any, error) {
		q := s.db.Q
		now := controlstore.Millis(s.now())
		// Bumping last_comment locks the issue row, which numbers the
		// comments of one issue one after another.
		res, err := tx.ExecContext(ctx, q(`UPDATE issues SET last_comment = last_comment + 1, updated_at = ? WHERE tenant = ? AND env = ? AND number = ?`),
			now, sc.Tenant, sc.Env, number)
		if err != nil {
			return nil, fmt.Errorf("comment issue: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return nil, ErrNotFound
		}
		var seq int64
		if err := tx.QueryRowContext(ctx, q(`SELECT last_comment FROM issues WHERE tenant = ? AND env = ? AND number = ?`), sc.Tenant, sc.Env, number).Scan(&seq); err != nil {
			return nil, fmt.Errorf("comment issue: %w", err)
		}
		if _, err := tx.ExecContext(ctx, q(`INSERT INTO issue_comments (tenant, env, number, seq, body, conversation_id, user_id, created_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`), sc.Tenant, sc.Env, number, seq, c.Body, sc.Conversation, sc.User, now); err != nil {
			return nil, fmt.Errorf("comment issue: %w", err)
		}
		is, err := s.issue(ctx, tx, sc.Tenant, sc.Env, number, true)
		if err != nil {
			return nil, err
		}
		return contract.IssueAck{IdempotencyKey: c.IdempotencyKey, Issue: is}, nil
	})
	if err != nil {
		return contract.IssueAck{}, err
	}
	return decodeIssueAck(raw, dup)
}

func nullString(p *string) sql.NullString {
	if p == nil {
		return sql.NullString{}
	}
	return sql.NullString{String: *p, Valid: true}
}

type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

const issueColumns = `tenant, env, number, title, body, state, conversation_id, user_id, created_at, updated_at`

func scanIssue(sc interface{ Scan(...any) error }) (contract.Issue, error) {
	var is contract.Issue
	var created, updated int64
	err := sc.Scan(&is.Tenant, &is.Env, &is.Number, &is.Title, &is.Body, &is.State, &is.ConversationID, &is.UserID, &created, &updated)
	is.CreatedAt, is.UpdatedAt = time.UnixMilli(created).UTC(), time.UnixMilli(updated).UTC()
	return is, err
}

func (s *Store) issue(ctx context.Context, qr queryer, tenant, env string, number int64, comments bool) (contract.Issue, error) {
	q := s.db.Q
	is, err := scanIssue(qr.QueryRowContext(ctx, q(`SELECT `+issueColumns+` FROM issues WHERE tenant = ? AND env = ? AND number = ?`), tenant, env, number))
	if errors.Is(err, sql.ErrNoRows) {
		return contract.Issue{}, ErrNotFound
	}
	if err != nil {
		return contract.Issue{}, fmt.Errorf("read issue: %w", err)
	}
	if !comments {
		return is, nil
	}
	rows, err := qr.QueryContext(ctx, q(`SELECT seq, body, conversation_id, user_id, created_at FROM issue_comments
		WHERE tenant = ? AND env = ? AND number = ? ORDER BY seq`), tenant, env, number)
	if err != nil {
		return contract.Issue{}, fmt.Errorf("read issue comments: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var c contract.IssueCommentEntry
		var at int64
		if err := rows.Scan(&c.Seq, &c.Body, &c.ConversationID, &c.UserID, &at); err != nil {
			return contract.Issue{}, fmt.Errorf("read issue comments: %w", err)
		}
		c.CreatedAt = time.UnixMilli(at).UTC()
		is.Comments = append(is.Comments, c)
	}
	if err := rows.Err(); err != nil {
		return contract.Issue{}, fmt.Errorf("read issue comments: %w", err)
	}
	return is, nil
}

// Issue returns issue number of (tenant, env) with its comments, or
// ErrNotFound.
func (s *Store) Issue(ctx context.Context, tenant, env string, number int64) (contract.Issue, error) {
	return s.issue(ctx, s.db.SQL, tenant, env, number, true)
}

// Issue list filters.
const (
	StateAll = "all"
	// DefaultIssueLimit and MaxIssueLimit bound ListIssues.
	DefaultIssueLimit = 50
	MaxIssueLimit     = 200
)

// ListIssues returns up to limit issues of (tenant, env) in state (IssueOpen,
// IssueClosed or StateAll), newest first, with numbers below before (0: no
// bound).
func (s *Store) ListIssues(ctx context.Context, tenant, env, state string, before int64, limit int) ([]contract.Issue, error) {
	if limit <= 0 || limit > MaxIssueLimit {
		limit = DefaultIssueLimit
	}
	if before <= 0 {
		before = 1 << 62
	}
	query := `SELECT ` + issueColumns + ` FROM issues WHERE tenant = ? AND env = ? AND number < ?`
	args := []any{tenant, env, before}
	if state != StateAll {
		query += ` AND state = ?`
		args = append(args, state)
	}
	query += ` ORDER BY number DESC LIMIT ?`
	args = append(args, limit)
	rows, err := s.db.SQL.QueryContext(ctx, s.db.Q(query), args...)
	if err != nil {
		return nil, fmt.Errorf("list issues: %w", err)
	}
	defer rows.Close()
	out := []contract.Issue{}
	for rows.Next() {
		is, err := scanIssue(rows)
		if err != nil {
			return nil, fmt.Errorf("list issues: %w", err)
		}
		out = append(out, is)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list issues: %w", err)
	}
	return out, nil
}

// MaxActivity bounds each list of Activity.
const MaxActivity = 1000

// Activity returns what a conversation reported with event ids above after:
// up to limit (at most MaxActivity) activity entries, tool calls and turns,
// each in event order.
func (s *Store) Activity(ctx context.Context, conv string, after int64, limit int) (contract.ConversationActivity, error) {
	if limit <= 0 || limit > MaxActivity {
		limit = MaxActivity
	}
	q := s.db.Q
	out := contract.ConversationActivity{ConversationID: conv, Activity: []contract.ActivityEntry{}, ToolCalls: []contract.ToolCall{}, Turns: []contract.TurnUsage{}}
	rows, err := s.db.SQL.QueryContext(ctx, q(`SELECT event_id, type, at, summary FROM activity_log
		WHERE conversation_id = ? AND event_id > ? ORDER BY event_id LIMIT ?`), conv, after, limit)
	if err != nil {
		return out, fmt.Errorf("read activity: %w", err)
	}
	for rows.Next() {
		var e contract.ActivityEntry
		var at int64
		if err := rows.Scan(&e.EventID, &e.Type, &at, &e.Summary); err != nil {
			rows.Close()
			return out, fmt.Errorf("read activity: %w", err)
		}
		e.Time = time.UnixMilli(at).UTC()
		out.Activity = append(out.Activity, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return out, fmt.Errorf("read activity: %w", err)
	}

	// A call without a result whose turn has ended (a later turn end was
	// reported) will never get one: the turn was interrupted or the worker
	// died.
	var lastTurnEnd sql.NullInt64
	if err := s.db.SQL.QueryRowContext(ctx, q(`SELECT MAX(event_id) FROM turn_usage WHERE conversation_id = ?`), conv).Scan(&lastTurnEnd); err != nil {
		return out, fmt.Errorf("read turn usage: %w", err)
	}
	rows, err = s.db.SQL.QueryContext(ctx, q(`SELECT tool_use_id, name, input, output, is_error, has_result, started_at, finished_at, first_event_id FROM tool_calls
		WHERE conversation_id = ? AND first_event_id > ? ORDER BY first_event_id LIMIT ?`), conv, after, limit)
	if err != nil {
		return out, fmt.Errorf("read tool calls: %w", err)
	}
	for rows.Next() {
		var c contract.ToolCall
		var input string
		var isErr, hasResult int
		var started, finished sql.NullInt64
		var firstEvent int64
		if err := rows.Scan(&c.ToolUseID, &c.Name, &input, &c.Output, &isErr, &hasResult, &started, &finished, &firstEvent); err != nil {
			rows.Close()
			return out, fmt.Errorf("read tool calls: %w", err)
		}
		c.Input = json.RawMessage("null")
		if input != "" {
			c.Input = json.RawMessage(input)
		}
		switch {
		case hasResult == 0 && lastTurnEnd.Valid && lastTurnEnd.Int64 > firstEvent:
			c.Status = "interrupted"
		case hasResult == 0:
			c.Status = "running"
		case isErr != 0:
			c.Status = "error"
		default:
			c.Status = "ok"
		}
		if started.Valid {
			t := time.UnixMilli(started.Int64).UTC()
			c.StartedAt = &t
		}
		if finished.Valid {
			t := time.UnixMilli(finished.Int64).UTC()
			c.FinishedAt = &t
		}
		out.ToolCalls = append(out.ToolCalls, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return out, fmt.Errorf("read tool calls: %w", err)
	}

	rows, err = s.db.SQL.QueryContext(ctx, q(`SELECT event_id, at, client_message_id, outcome, input_tokens, output_tokens, cache_write_tokens, cache_read_tokens,
			cost_nano, num_turns, duration_ms FROM turn_usage WHERE conversation_id = ? AND event_id > ? ORDER BY event_id LIMIT ?`), conv, after, limit)
	if err != nil {
		return out, fmt.Errorf("read turn usage: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var u contract.TurnUsage
		var at int64
		if err := rows.Scan(&u.EventID, &at, &u.ClientMessageID, &u.Outcome, &u.Usage.InputTokens, &u.Usage.OutputTokens,
			&u.Usage.CacheCreationInputTokens, &u.Usage.CacheReadInputTokens, &u.CostNanoUSD, &u.NumTurns, &u.DurationMS); err != nil {
			return out, fmt.Errorf("read turn usage: %w", err)
		}
		u.Time = time.UnixMilli(at).UTC()
		out.Turns = append(out.Turns, u)
	}
	return out, rows.Err()
}
