// Package reportfeed turns each conversation's durable event log into
// reports in the worker's outbox: one activity entry per event, a tool event
// per tool_use and tool_result, and a usage report per finished turn.
//
// It follows every conversation's log from a cursor persisted next to the
// outbox, so it needs nothing from the harness but a wake-up (Notify, wired
// to harness.Config.OnEvent) and survives restarts: on start it catches up
// every conversation from its cursor. Report keys are derived from the event
// id ("<conversation>:<event id>:<kind>"), so a report enqueued again after
// a crash between enqueue and cursor save is stored once by the control
// plane. When the outbox is full the feed stops advancing and waits for
// room: the event log is the overflow and nothing is lost. Any other
// failure (out of open files, a full disk) is retried with a backoff.
//
// Main types: Feed; Reports maps one event to its reports. It does not send
// anything (package outbox does).
package reportfeed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/atomicfile"
	"github.com/talkide/talkide/internal/worker/outbox"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// Logs gives access to conversations' event logs (the harness).
type Logs interface {
	Events(conv string) (*sessionstore.EventLog, error)
}

// Config configures a Feed.
type Config struct {
	// Outbox receives the reports. Required.
	Outbox *outbox.Outbox
	// Logs opens event logs. Required.
	Logs Logs
	// List returns every conversation id of the worker (sessionstore.Store.List).
	// Required.
	List func() ([]string, error)
	// Dir holds the cursors (on the session volume). Required.
	Dir    string
	Logger *slog.Logger
}

// Feed follows conversations' event logs into the outbox.
type Feed struct {
	cfg Config
	log *slog.Logger

	mu sync.Mutex
	// dirty are conversations with events the feed may not have taken yet;
	// guarded by mu.
	dirty map[string]bool
	// wake is signalled by Notify; buffered, never closed.
	wake chan struct{}
}

// New returns a Feed; call Run.
func New(cfg Config) (*Feed, error) {
	if cfg.Outbox == nil || cfg.Logs == nil || cfg.List == nil || cfg.Dir == "" {
		return nil, errors.New("report feed config: Outbox, Logs, List and Dir are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("report feed: %w", err)
	}
	return &Feed{cfg: cfg, log: cfg.Logger, dirty: map[string]bool{}, wake: make(chan struct{}, 1)}, nil
}

// Notify tells the feed that ev was stored. It never blocks; wire it to
// harness.Config.OnEvent.
func (f *Feed) Notify(ev contract.Event) {
	f.mu.Lock()
	f.dirty[ev.ConversationID] = true
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Run catches up every conversation, then follows new events until ctx ends.
// A conversation the feed could not take (the outbox or the event log
// failed: out of open files, a full disk) is tried again after a backoff,
// as is the listing of conversations at start: a transient failure delays
// reports, it never leaves them behind.
func (f *Feed) Run(ctx context.Context) error {
	listed := false
	delay := minRetry
	for {
		if !listed {
			if ids, err := f.cfg.List(); err != nil {
				f.log.Error("list conversations for reporting", "err", err)
			} else {
				listed = true
				f.mu.Lock()
				for _, id := range ids {
					f.dirty[id] = true
				}
				f.mu.Unlock()
			}
		}
		f.mu.Lock()
		convs := make([]string, 0, len(f.dirty))
		for c := range f.dirty {
			convs = append(convs, c)
		}
		clear(f.dirty)
		f.mu.Unlock()
		slices.Sort(convs)
		var blocked, failed []string
		for _, c := range convs {
			if ctx.Err() != nil {
				return nil
			}
			switch err := f.catchUp(c); {
			case errors.Is(err, outbox.ErrFull):
				blocked = append(blocked, c)
			case err != nil:
				f.log.Error("report events; retrying", "conversation", c, "err", err)
				failed = append(failed, c)
			}
		}
		var space <-chan struct{}
		if len(blocked) > 0 {
			space = f.cfg.Outbox.Space()
			if n, _ := f.cfg.Outbox.Len(); n == 0 {
				// Emptied between the refusal and now: go again at once.
				closed := make(chan struct{})
				close(closed)
				space = closed
			}
		}
		var retry <-chan time.Time
		if len(failed) > 0 || !listed {
			retry = time.After(delay)
			delay = min(2*delay, maxRetry)
		} else {
			delay = minRetry
		}
		select {
		case <-ctx.Done():
			return nil
		case <-f.wake:
		case <-space:
		case <-retry:
		}
		f.mu.Lock()
		for _, c := range slices.Concat(blocked, failed) {
			f.dirty[c] = true
		}
		f.mu.Unlock()
	}
}

// minRetry and maxRetry bound the wait before a failed conversation is
// tried again (doubling in between).
const (
	minRetry = 100 * time.Millisecond
	maxRetry = 10 * time.Second
)

// batch is how many events the feed reads at a time; the cursor is saved
// after each batch.
const batch = 256

// catchUp puts the reports of conv's events after its cursor into the
// outbox. It returns outbox.ErrFull when the outbox took no more.
func (f *Feed) catchUp(conv string) error {
	cursor, err := f.cursor(conv)
	if err != nil {
		return err
	}
	el, err := f.cfg.Logs.Events(conv)
	if err != nil {
		return err
	}
	for {
		evs, err := el.Since(cursor, batch)
		if err != nil || len(evs) == 0 {
			return err
		}
		start := cursor
		var putErr error
		for _, ev := range evs {
			if putErr = f.put(conv, ev); putErr != nil {
				break
			}
			cursor = ev.ID
		}
		if cursor != start {
			if err := f.saveCursor(conv, cursor); err != nil {
				return err
			}
		}
		if putErr != nil {
			return putErr
		}
	}
}

func (f *Feed) put(conv string, ev contract.Event) error {
	for _, r := range Reports(ev) {
		if _, err := f.cfg.Outbox.Put(conv, "POST", r.Path, r.Key, r.Body); err != nil {
			return err
		}
	}
	return nil
}

type cursorFile struct {
	Format  int   `json:"format"`
	EventID int64 `json:"event_id"`
}

func (f *Feed) cursorPath(conv string) string { return filepath.Join(f.cfg.Dir, conv+".json") }

func (f *Feed) cursor(conv string) (int64, error) {
	b, err := os.ReadFile(f.cursorPath(conv))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read report cursor: %w", err)
	}
	var c cursorFile
	if err := json.Unmarshal(b, &c); err != nil || c.Format != 1 {
		return 0, fmt.Errorf("read report cursor of %s: unknown format", conv)
	}
	return c.EventID, nil
}

func (f *Feed) saveCursor(conv string, id int64) error {
	b, _ := json.Marshal(cursorFile{Format: 1, EventID: id})
	if err := atomicfile.WriteFile(f.cursorPath(conv), b, 0o600); err != nil {
		return fmt.Errorf("save report cursor: %w", err)
	}
	return nil
}

// Report is one request for the outbox.
type Report struct {
	Path string
	Key  string
	Body []byte
}

// Reports maps one event to its reports: a tool event for tool_use and
// tool_result, a usage report for turn_completed and turn_failed, and an
// activity entry for every event, in that order.
func Reports(ev contract.Event) []Report {
	key := func(kind string) string { return fmt.Sprintf("%s:%d:%s", ev.ConversationID, ev.ID, kind) }
	var out []Report
	add := func(path, kind string, v any) {
		b, err := json.Marshal(v)
		if err == nil {
			out = append(out, Report{Path: path, Key: key(kind), Body: b})
		}
	}
	switch ev.Type {
	case contract.EventToolUse:
		var p contract.ToolUse
		if json.Unmarshal(ev.Data, &p) == nil && p.ToolUseID != "" {
			add(contract.PathReportToolEvents, "tool", contract.ToolEventReport{IdempotencyKey: key("tool"), EventID: ev.ID, Time: ev.Time,
				Phase: contract.ToolPhaseUse, ToolUseID: clip(p.ToolUseID, 200), Name: clip(p.Name, 200), Input: clipJSON(p.Input)})
		}
	case contract.EventToolResult:
		var p contract.ToolResult
		if json.Unmarshal(ev.Data, &p) == nil && p.ToolUseID != "" {
			add(contract.PathReportToolEvents, "tool", contract.ToolEventReport{IdempotencyKey: key("tool"), EventID: ev.ID, Time: ev.Time,
				Phase: contract.ToolPhaseResult, ToolUseID: clip(p.ToolUseID, 200), Output: clip(p.Content, contract.MaxToolOutput), IsError: p.IsError})
		}
	case contract.EventTurnCompleted:
		var p contract.TurnCompleted
		if json.Unmarshal(ev.Data, &p) == nil {
			add(contract.PathReportUsage, "usage", contract.UsageReport{IdempotencyKey: key("usage"), EventID: ev.ID, Time: ev.Time,
				ClientMessageID: clip(p.ClientMessageID, 64), Outcome: contract.OutcomeCompleted, Usage: nonNegative(p.Usage),
				CostNanoUSD: max(p.CostNanoUSD, 0), NumTurns: max(p.NumTurns, 0), DurationMS: max(p.DurationMS, 0)})
		}
	case contract.EventTurnFailed:
		var p contract.TurnFailed
		if json.Unmarshal(ev.Data, &p) == nil {
			add(contract.PathReportUsage, "usage", contract.UsageReport{IdempotencyKey: key("usage"), EventID: ev.ID, Time: ev.Time,
				ClientMessageID: clip(p.ClientMessageID, 64), Outcome: contract.OutcomeFailed, Usage: nonNegative(p.Usage)})
		}
	}
	add(contract.PathReportActivity, "activity", contract.ActivityReport{IdempotencyKey: key("activity"), EventID: ev.ID, Time: ev.Time,
		Type: ev.Type, Summary: clip(Summary(ev), contract.MaxSummary), Ref: clip(Ref(ev), 200)})
	return out
}

// Ref is what ev is about when a later event settles it: the request id of
// a permission event, the build id of a build event; "" otherwise.
func Ref(ev contract.Event) string {
	var p struct {
		RequestID string `json:"request_id"`
		BuildID   string `json:"build_id"`
	}
	switch ev.Type {
	case contract.EventPermissionRequested, contract.EventPermissionResolved:
		_ = json.Unmarshal(ev.Data, &p)
		return p.RequestID
	case contract.EventBuildStarted, contract.EventBuildProgress, contract.EventBuildCompleted:
		_ = json.Unmarshal(ev.Data, &p)
		return p.BuildID
	}
	return ""
}

func nonNegative(u contract.Usage) contract.Usage {
	u.InputTokens, u.OutputTokens = max(u.InputTokens, 0), max(u.OutputTokens, 0)
	u.CacheCreationInputTokens, u.CacheReadInputTokens = max(u.CacheCreationInputTokens, 0), max(u.CacheReadInputTokens, 0)
	return u
}

// Summary is the one-line activity text of an event.
func Summary(ev contract.Event) string {
	var s string
	switch ev.Type {
	case contract.EventSessionStarted:
		var p contract.SessionStarted
		_ = json.Unmarshal(ev.Data, &p)
		s = "agent session started"
		if p.Resumed {
			s = "agent session resumed"
		}
		if p.Model != "" {
			s += " (model " + p.Model + ")"
		}
	case contract.EventUserMessage:
		var p contract.UserMessage
		_ = json.Unmarshal(ev.Data, &p)
		s = "user: " + oneLine(p.Text, 300)
	case contract.EventTurnStarted:
		var p contract.TurnStarted
		_ = json.Unmarshal(ev.Data, &p)
		s = "turn started (message " + p.ClientMessageID + ")"
	case contract.EventAssistantText:
		var p contract.AssistantText
		_ = json.Unmarshal(ev.Data, &p)
		s = "assistant: " + oneLine(p.Text, 300)
	case contract.EventToolUse:
		var p contract.ToolUse
		_ = json.Unmarshal(ev.Data, &p)
		s = "tool " + p.Name + ": " + oneLine(string(p.Input), 300)
	case contract.EventToolResult:
		var p contract.ToolResult
		_ = json.Unmarshal(ev.Data, &p)
		s = "tool result: "
		if p.IsError {
			s = "tool error: "
		}
		s += oneLine(p.Content, 300)
	case contract.EventAPIRetry:
		var p contract.APIRetry
		_ = json.Unmarshal(ev.Data, &p)
		s = fmt.Sprintf("model call retry %d/%d (%s, status %d)", p.Attempt, p.MaxRetries, p.Error, p.ErrorStatus)
	case contract.EventTurnCompleted:
		var p contract.TurnCompleted
		_ = json.Unmarshal(ev.Data, &p)
		s = fmt.Sprintf("turn completed: %d input, %d output tokens", p.Usage.InputTokens, p.Usage.OutputTokens)
	case contract.EventTurnFailed:
		var p contract.TurnFailed
		_ = json.Unmarshal(ev.Data, &p)
		s = "turn failed (" + p.Reason + "): " + oneLine(p.Message, 300)
	case contract.EventError:
		var p contract.ErrorEvent
		_ = json.Unmarshal(ev.Data, &p)
		s = "error " + p.Code + ": " + oneLine(p.Message, 300)
	case contract.EventSessionStopped:
		var p contract.SessionStopped
		_ = json.Unmarshal(ev.Data, &p)
		s = fmt.Sprintf("agent process stopped (%s, exit code %d)", p.Reason, p.ExitCode)
	case contract.EventMCPServerRefused:
		var p contract.MCPServerRefused
		_ = json.Unmarshal(ev.Data, &p)
		s = "MCP server " + p.Server + " refused: " + p.Reason
	default:
		s = string(ev.Type)
	}
	return s
}

// oneLine flattens s to one line of at most n runes ("…" when cut).
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}

// clip cuts s to at most n bytes on a rune boundary, as valid UTF-8.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// clipJSON keeps a tool input up to contract.MaxToolInput bytes, else
// replaces it with {"truncated":true,"bytes":N}.
func clipJSON(in json.RawMessage) json.RawMessage {
	if len(in) == 0 || !json.Valid(in) {
		return nil
	}
	if len(in) <= contract.MaxToolInput {
		return in
	}
	return json.RawMessage(fmt.Sprintf(`{"truncated":true,"bytes":%d}`, len(in)))
}
