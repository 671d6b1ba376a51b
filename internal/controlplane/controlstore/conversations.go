package controlstore

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ConversationSummary is one row of a user's conversation list: the
// conversation with what the control plane knows of it from the worker's
// reports (the activity log) and the gateway's ledger.
type ConversationSummary struct {
	Conversation
	// Title is the name the user gave it, else the first user message
	// (one line, at most TitleFromMessageRunes runes), else "".
	Title string
	// Named is true when Title was set by the user (rename).
	Named bool
	// LastActivity is the time of the newest reported event (by event id:
	// one index seek, however long the log), else the creation time.
	LastActivity time.Time
	// Running is true when the newest reported turn boundary is a turn
	// start (a turn is in progress, as far as the reports have come).
	Running bool
	// PendingPermissions counts permission requests reported and not yet
	// reported resolved (a request raised again after a worker restart
	// counts once).
	PendingPermissions int
	// SpentNano is the sum of the gateway's debits booked for the
	// conversation, in nano-USD.
	SpentNano int64
}

// TitleFromMessageRunes bounds a title taken from the first message.
const TitleFromMessageRunes = 80

// MaxTitleBytes bounds a title the user sets.
const MaxTitleBytes = 200

// ConversationFilter selects a user's live conversations for
// ListConversations. Tenant and Env narrow the list when set.
type ConversationFilter struct {
	UserID, Tenant, Env string
	// Cursor continues a list: the NextCursor of the previous page ("" for
	// the first page).
	Cursor string
	// Limit is the page size, 1 to 100.
	Limit int
}

// ErrBadCursor is returned for a cursor ListConversations did not make.
var ErrBadCursor = errors.New("invalid cursor")

// summaryColumns selects a ConversationSummary of conversation c.
const summaryColumns = `c.id, c.tenant, c.env, c.user_id, c.model, c.created_at, c.title,
	(SELECT a.summary FROM activity_log a WHERE a.conversation_id = c.id AND a.type = 'user_message' ORDER BY a.event_id LIMIT 1),
	(SELECT a.at FROM activity_log a WHERE a.conversation_id = c.id ORDER BY a.event_id DESC LIMIT 1),
	(SELECT a.type FROM activity_log a WHERE a.conversation_id = c.id AND a.type IN ('turn_started', 'turn_completed', 'turn_failed') ORDER BY a.event_id DESC LIMIT 1),
	(SELECT COUNT(DISTINCT r.ref) FROM activity_log r WHERE r.conversation_id = c.id AND r.type = 'permission_requested' AND r.ref <> ''
		AND NOT EXISTS (SELECT 1 FROM activity_log x WHERE x.conversation_id = r.conversation_id AND x.type = 'permission_resolved' AND x.ref = r.ref AND x.event_id > r.event_id)),
	(SELECT SUM(l.amount_nano) FROM budget_ledger l WHERE l.conversation_id = c.id AND l.kind = 'debit')`

func scanSummary(sc interface{ Scan(...any) error }) (ConversationSummary, error) {
	var s ConversationSummary
	var created int64
	var first, turn sql.NullString
	var last, spent sql.NullInt64
	if err := sc.Scan(&s.ID, &s.Tenant, &s.Env, &s.UserID, &s.Model, &created, &s.Title, &first, &last, &turn, &s.PendingPermissions, &spent); err != nil {
		return s, err
	}
	s.CreatedAt = time.UnixMilli(created).UTC()
	s.LastActivity = s.CreatedAt
	if last.Valid && last.Int64 > created {
		s.LastActivity = time.UnixMilli(last.Int64).UTC()
	}
	s.Named = s.Title != ""
	if !s.Named && first.Valid {
		s.Title = titleFromSummary(first.String)
	}
	s.Running = turn.String == "turn_started"
	s.SpentNano = spent.Int64
	return s, nil
}

// titleFromSummary makes a title of a user_message activity summary
// ("user: <text>").
func titleFromSummary(s string) string {
	s = strings.Join(strings.Fields(strings.TrimPrefix(s, "user: ")), " ")
	if utf8.RuneCountInString(s) > TitleFromMessageRunes {
		r := []rune(s)
		s = strings.TrimSpace(string(r[:TitleFromMessageRunes-1])) + "…"
	}
	return s
}

// ListConversations returns a page of f.UserID's live conversations, newest
// first (by creation, then id), and the cursor of the next page ("" after
// the last). A malformed cursor is ErrBadCursor.
func (db *DB) ListConversations(ctx context.Context, f ConversationFilter) ([]ConversationSummary, string, error) {
	if f.Limit < 1 || f.Limit > 100 {
		return nil, "", fmt.Errorf("list conversations: limit %d is not within 1-100", f.Limit)
	}
	where := []string{"c.user_id = ?", "c.deleted_at IS NULL"}
	args := []any{f.UserID}
	if f.Tenant != "" {
		where, args = append(where, "c.tenant = ?"), append(args, f.Tenant)
	}
	if f.Env != "" {
		where, args = append(where, "c.env = ?"), append(args, f.Env)
	}
	if f.Cursor != "" {
		at, id, err := decodeCursor(f.Cursor)
		if err != nil {
			return nil, "", err
		}
		where = append(where, "(c.created_at < ? OR (c.created_at = ? AND c.id < ?))")
		args = append(args, at, at, id)
	}
	args = append(args, f.Limit+1)
	rows, err := db.SQL.QueryContext(ctx, db.Q(`SELECT `+summaryColumns+` FROM conversations c WHERE `+
		strings.Join(where, " AND ")+` ORDER BY c.created_at DESC, c.id DESC LIMIT ?`), args...)
	if err != nil {
		return nil, "", fmt.Errorf("list conversations: %w", err)
	}
	defer rows.Close()
	var out []ConversationSummary
	for rows.Next() {
		s, err := scanSummary(rows)
		if err != nil {
			return nil, "", fmt.Errorf("list conversations: %w", err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("list conversations: %w", err)
	}
	next := ""
	if len(out) > f.Limit {
		out = out[:f.Limit]
		last := out[len(out)-1]
		next = encodeCursor(Millis(last.CreatedAt), last.ID)
	}
	return out, next, nil
}

// ConversationSummaryOf returns the summary of live conversation id, or
// ErrNotFound.
func (db *DB) ConversationSummaryOf(ctx context.Context, id string) (ConversationSummary, error) {
	s, err := scanSummary(db.SQL.QueryRowContext(ctx, db.Q(`SELECT `+summaryColumns+` FROM conversations c WHERE c.id = ? AND c.deleted_at IS NULL`), id))
	if errors.Is(err, sql.ErrNoRows) {
		return s, ErrNotFound
	}
	if err != nil {
		return s, fmt.Errorf("look up conversation: %w", err)
	}
	return s, nil
}

// RenameConversation sets live conversation id's title ("" goes back to
// the first message), or returns ErrNotFound. The caller checks the title
// (CleanTitle).
func (db *DB) RenameConversation(ctx context.Context, id, title string) error {
	res, err := db.SQL.ExecContext(ctx, db.Q(`UPDATE conversations SET title = ? WHERE id = ? AND deleted_at IS NULL`), title, id)
	if err != nil {
		return fmt.Errorf("rename conversation: %w", err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return ErrNotFound
	}
	return nil
}

// CleanTitle trims a title a user sent and checks it: valid UTF-8 of at
// most MaxTitleBytes, one line, no control, zero-width or text-direction
// characters. "" is allowed (back to the first message).
func CleanTitle(t string) (string, error) {
	t = strings.TrimSpace(t)
	switch {
	case !utf8.ValidString(t):
		return "", errors.New("title must be UTF-8")
	case len(t) > MaxTitleBytes:
		return "", fmt.Errorf("title must be at most %d bytes", MaxTitleBytes)
	case strings.ContainsFunc(t, func(r rune) bool {
		return r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == 0x2028 || r == 0x2029
	}):
		return "", errors.New("title must be one line without control characters")
	case strings.ContainsFunc(t, invisible):
		return "", errors.New("title must not hold invisible or text-direction characters (U+200B-U+200F, U+202A-U+202E, U+2060-U+2069, U+FEFF)")
	}
	return t, nil
}

// invisible reports the zero-width and bidirectional-control characters
// that make a title read other than it is (a right-to-left override turns
// "gnp.exe" into "exe.png").
func invisible(r rune) bool {
	return (r >= 0x200b && r <= 0x200f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2060 && r <= 0x2069) || r == 0xfeff
}

func encodeCursor(at int64, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(at, 10) + "." + id))
}

func decodeCursor(c string) (int64, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || len(c) > 200 {
		return 0, "", ErrBadCursor
	}
	at, id, ok := strings.Cut(string(b), ".")
	n, err := strconv.ParseInt(at, 10, 64)
	if !ok || err != nil || id == "" {
		return 0, "", ErrBadCursor
	}
	return n, id, nil
}

// Grant is a tenant-env a user may work in.
type Grant struct{ Tenant, Env string }

// Grants returns the tenant-envs of userID, sorted.
func (db *DB) Grants(ctx context.Context, userID string) ([]Grant, error) {
	rows, err := db.SQL.QueryContext(ctx, db.Q(`SELECT tenant, env FROM grants WHERE user_id = ? ORDER BY tenant, env`), userID)
	if err != nil {
		return nil, fmt.Errorf("list grants: %w", err)
	}
	defer rows.Close()
	out := []Grant{}
	for rows.Next() {
		var g Grant
		if err := rows.Scan(&g.Tenant, &g.Env); err != nil {
			return nil, fmt.Errorf("list grants: %w", err)
		}
		out = append(out, g)
	}
	return out, rows.Err()
}
