// Package reportfeed reports each conversation's events to the control
// plane: one activity entry per event, a tool event per tool_use and
// tool_result, and a usage report per finished turn.
//
// The event log is the durable queue: the feed reads each conversation's
// log after its cursor, sends what it finds in batches (one request carries
// the reports of many conversations, each group under its conversation's
// WorkerToken; the control plane stores a batch in one transaction), and
// moves the cursor only past what the control plane answered. Nothing is
// written to disk per event: the cursors are saved every few seconds, and
// a cursor that is behind after a crash only makes the feed send reports
// again, which the control plane stores once (report keys are derived from
// the event id, "<conversation>:<event id>:<kind>"). A request that fails
// (the control plane unreachable, or answering 429 or 5xx) is retried with
// a backoff; a report the control plane refuses for good is logged and
// counted, and the conversation's next report follows.
//
// It needs nothing from the harness but a wake-up (Notify, wired to
// harness.Config.OnEvent), and survives restarts: on start it catches up
// every conversation from its saved cursor.
//
// Main types: Feed, Sender (implemented by package reportclient); Reports
// maps one event to its reports.
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

	"github.com/prometheus/client_golang/prometheus"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/atomicfile"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// Logs gives access to conversations' event logs (the harness). Events
// returns an error wrapping sessionstore.ErrNotFound for a conversation
// that no longer exists.
type Logs interface {
	Events(conv string) (*sessionstore.EventLog, error)
}

// Sender delivers report batches (reportclient.Client).
type Sender interface {
	// SendReports sends groups in one request and returns one result per
	// group, in order. An error means the request failed as a whole (the
	// control plane unreachable, or answering 429 or 5xx): every group is
	// sent again later.
	SendReports(ctx context.Context, groups []Group) ([]GroupResult, error)
}

// Group is one conversation's reports in a batch, in event order.
type Group struct {
	Conversation string
	Reports      []Report
}

// GroupResult is how one group of a batch ended.
type GroupResult struct {
	// Err is why the group was not taken: its WorkerToken could not be
	// minted or was refused, or a report could not be stored now. Nil
	// when the control plane answered every report.
	Err error
	// Permanent is set with Err when retrying cannot help (the mint
	// refused the conversation): the group's reports are dropped, logged
	// and counted.
	Permanent bool
	// Refused describes the reports the control plane refused for good
	// (invalid, or a key reused for another report), one line each.
	Refused []string
}

// Config configures a Feed.
type Config struct {
	// Sender delivers the reports. Required.
	Sender Sender
	// Logs opens event logs. Required.
	Logs Logs
	// List returns every conversation id of the worker (sessionstore.Store.List).
	// Required.
	List func() ([]string, error)
	// Dir holds the cursors (on the session volume). Required.
	Dir string
	// Metrics receives the feed's measurements; nil: kept unregistered.
	Metrics *Metrics
	Logger  *slog.Logger
}

// Metrics are the feed's Prometheus measurements.
type Metrics struct {
	sent, refused, failed, skipped prometheus.Counter
}

// NewMetrics creates the feed's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		sent: prometheus.NewCounter(prometheus.CounterOpts{Name: "talkide_worker_reports_sent_total",
			Help: "Event reports (activity, tool events, usage) the control plane stored, or had stored before."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "talkide_worker_reports_refused_total",
			Help: "Event reports the control plane refused for good (invalid, a reused key, a conversation the mint refuses); logged, not sent again."}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{Name: "talkide_worker_report_batches_failed_total",
			Help: "Report batches that failed as a whole (control plane unreachable, 429 or 5xx) and are sent again after a backoff."}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{Name: "talkide_worker_report_events_skipped_total",
			Help: "Events never reported because the event log dropped them (its retention bound) while the control plane was further behind."}),
	}
	reg.MustRegister(m.sent, m.refused, m.failed, m.skipped)
	return m
}

// cursor is the feed's position in one conversation's log: taken, every
// event up to this id was answered by the control plane; saved, the id in
// the cursor file.
type cursor struct{ taken, saved int64 }

// Feed follows conversations' event logs to the control plane.
type Feed struct {
	cfg Config
	log *slog.Logger

	mu sync.Mutex
	// dirty are conversations with events the feed may not have sent yet;
	// guarded by mu.
	dirty map[string]bool
	// wake is signalled by Notify; buffered, never closed.
	wake chan struct{}

	// cursors, backoff and lastSave are Run's alone. cursors holds those
	// read or moved since the last save.
	cursors  map[string]*cursor
	backoff  map[string]*retry
	lastSave time.Time
}

// New returns a Feed; call Run.
func New(cfg Config) (*Feed, error) {
	if cfg.Sender == nil || cfg.Logs == nil || cfg.List == nil || cfg.Dir == "" {
		return nil, errors.New("report feed config: Sender, Logs, List and Dir are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("report feed: %w", err)
	}
	return &Feed{cfg: cfg, log: cfg.Logger, dirty: map[string]bool{}, wake: make(chan struct{}, 1),
		cursors: map[string]*cursor{}, backoff: map[string]*retry{}}, nil
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

// Timing of the feed.
const (
	// linger is the least time between two requests: the reports of events
	// that come close together go in one request.
	linger = 25 * time.Millisecond
	// minRetry and maxRetry bound the wait before a failed conversation or
	// request is tried again (doubling in between).
	minRetry = 100 * time.Millisecond
	maxRetry = 10 * time.Second
	// cursorSaveEvery is how often moved cursors are saved.
	cursorSaveEvery = 5 * time.Second
)

// Bounds of one request (within the control plane's, contract.MaxReportBatch*).
const (
	batchEvents  = 256 // events read from one log at a time
	batchGroups  = contract.MaxReportBatchGroups
	batchReports = contract.MaxReportBatchReports
	batchBytes   = contract.MaxReportBatchBody / 2 // the rest: tokens and framing
)

// Run catches up every conversation, then follows new events until ctx ends;
// then it sends what is left once more (for at most finalFlush) and saves
// every moved cursor. A conversation the feed could not read or send is
// tried again after a backoff of its own (100 ms doubling to 10 s; its new
// events wait for it), so one that keeps failing delays no other; the
// listing of conversations at start is retried the same way: a transient
// failure delays reports, it never leaves them behind.
func (f *Feed) Run(ctx context.Context) error {
	defer f.saveCursors(true)
	defer f.flush()
	listed := false
	listDelay := minRetry
	var lastSend time.Time
	for {
		if !listed {
			if ids, err := f.cfg.List(); err != nil {
				f.log.Error("list conversations for reporting", "err", err)
			} else {
				listed = true
				f.markDirty(ids...)
			}
		}
		if wait := linger - time.Since(lastSend); wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
		}
		if f.round(ctx, f.takeDue(time.Now())) {
			lastSend = time.Now()
		}
		f.saveCursors(false)
		if ctx.Err() != nil {
			return nil
		}
		var retry <-chan time.Time
		if !listed {
			retry = time.After(listDelay)
			listDelay = min(2*listDelay, maxRetry)
		} else if at, ok := f.nextRetry(); ok {
			retry = time.After(time.Until(at))
		}
		if f.hasDue(time.Now()) {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-f.wake:
		case <-retry:
		case <-time.After(cursorSaveEvery):
		}
	}
}

// finalFlush bounds the last sending when Run ends.
const finalFlush = 5 * time.Second

// flush sends, once, every conversation's reports not yet sent (those
// backing off included), so a worker that stops has reported its last
// events when its control plane is up.
func (f *Feed) flush() {
	ctx, cancel := context.WithTimeout(context.Background(), finalFlush)
	defer cancel()
	for c := range f.backoff {
		f.markDirty(c)
		delete(f.backoff, c)
	}
	f.round(ctx, f.takeDue(time.Now()))
}

// retry is a failing conversation's backoff.
type retry struct {
	delay time.Duration
	at    time.Time
}

// takeDue returns, sorted, the dirty conversations not backing off, and
// forgets them as dirty; those backing off stay dirty for later.
func (f *Feed) takeDue(now time.Time) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	convs := make([]string, 0, len(f.dirty))
	for c := range f.dirty {
		if r := f.backoff[c]; r != nil && now.Before(r.at) {
			continue
		}
		convs = append(convs, c)
		delete(f.dirty, c)
	}
	slices.Sort(convs)
	return convs
}

// hasDue reports whether a dirty conversation may be sent now.
func (f *Feed) hasDue(now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.dirty {
		if r := f.backoff[c]; r == nil || !now.Before(r.at) {
			return true
		}
	}
	return false
}

// nextRetry is when the first conversation backing off may be tried again.
func (f *Feed) nextRetry() (time.Time, bool) {
	var first time.Time
	for _, r := range f.backoff {
		if first.IsZero() || r.at.Before(first) {
			first = r.at
		}
	}
	return first, !first.IsZero()
}

// failed puts conv in its backoff (doubling) and marks it dirty, to be
// tried again when the backoff ends.
func (f *Feed) failed(conv string) {
	r := f.backoff[conv]
	if r == nil {
		r = &retry{delay: minRetry}
		f.backoff[conv] = r
	} else {
		r.delay = min(2*r.delay, maxRetry)
	}
	r.at = time.Now().Add(r.delay)
	f.markDirty(conv)
}

func (f *Feed) markDirty(convs ...string) {
	f.mu.Lock()
	for _, c := range convs {
		f.dirty[c] = true
	}
	f.mu.Unlock()
}

// round sends the reports of convs' new events, in as few requests as the
// bounds allow, and reports whether a request was sent. A conversation
// that could not be read or sent goes into its backoff (failed); one with
// more events than a request took is marked dirty.
func (f *Feed) round(ctx context.Context, convs []string) (sent bool) {
	for len(convs) > 0 && ctx.Err() == nil {
		var groups []Group
		var lasts []int64
		var more []string
		reports, size := 0, 0
		i := 0
		for ; i < len(convs) && len(groups) < batchGroups; i++ {
			c := convs[i]
			after, err := f.cursor(c)
			if err != nil {
				f.log.Error("read report cursor; retrying", "conversation", c, "err", err)
				f.failed(c)
				continue
			}
			el, err := f.cfg.Logs.Events(c)
			if errors.Is(err, sessionstore.ErrNotFound) {
				f.forget(c)
				continue
			}
			var evs []contract.Event
			if err == nil {
				evs, err = el.Since(after, batchEvents)
			}
			if err != nil {
				f.log.Error("read events to report; retrying", "conversation", c, "err", err)
				f.failed(c)
				continue
			}
			if len(evs) == 0 {
				delete(f.backoff, c)
				continue
			}
			if gap := evs[0].ID - after - 1; gap > 0 {
				// The log kept its newest events only (its retention bound)
				// while the control plane was behind by more.
				f.log.Warn("reports of events the event log no longer holds were not sent", "conversation", c,
					"first_event", after+1, "last_event", evs[0].ID-1)
				f.cfg.Metrics.skipped.Add(float64(gap))
			}
			g, last, full := Group{Conversation: c}, after, false
			for _, ev := range evs {
				rs := Reports(ev)
				n := 0
				for _, r := range rs {
					n += len(r.Body) + len(r.Key) + 64
				}
				if reports+len(g.Reports)+len(rs) > batchReports || size+n > batchBytes {
					full = true
					break
				}
				g.Reports = append(g.Reports, rs...)
				size += n
				last = ev.ID
			}
			if len(g.Reports) > 0 {
				groups = append(groups, g)
				lasts = append(lasts, last)
				reports += len(g.Reports)
			}
			if full || len(evs) == batchEvents {
				more = append(more, c)
			}
			if full {
				i++
				break
			}
		}
		convs = convs[i:]
		if len(groups) == 0 {
			f.markDirty(more...)
			continue
		}
		res, err := f.cfg.Sender.SendReports(ctx, groups)
		sent = true
		if err == nil && len(res) != len(groups) {
			err = fmt.Errorf("%d answers for %d groups", len(res), len(groups))
		}
		if err != nil {
			if ctx.Err() == nil {
				f.log.Error("send reports; retrying", "groups", len(groups), "reports", reports, "err", err)
				f.cfg.Metrics.failed.Inc()
			}
			for _, g := range groups {
				f.failed(g.Conversation)
			}
			f.markDirty(more...)
			f.markDirty(convs...)
			return sent
		}
		for k, g := range groups {
			r := res[k]
			for _, why := range r.Refused {
				f.log.Warn("report refused by the control plane; not sent again", "conversation", g.Conversation, "report", why)
			}
			f.cfg.Metrics.refused.Add(float64(len(r.Refused)))
			switch {
			case r.Err == nil:
				f.cfg.Metrics.sent.Add(float64(len(g.Reports) - len(r.Refused)))
				f.advance(g.Conversation, lasts[k])
				delete(f.backoff, g.Conversation)
			case r.Permanent:
				f.log.Error("reports of a conversation refused; dropped", "conversation", g.Conversation, "reports", len(g.Reports), "err", r.Err)
				f.cfg.Metrics.refused.Add(float64(len(g.Reports)))
				f.advance(g.Conversation, lasts[k])
				delete(f.backoff, g.Conversation)
			default:
				f.log.Error("send reports of a conversation; retrying", "conversation", g.Conversation, "err", r.Err)
				f.failed(g.Conversation)
			}
		}
		f.markDirty(more...)
	}
	return sent
}

type cursorFile struct {
	Format  int   `json:"format"`
	EventID int64 `json:"event_id"`
}

func (f *Feed) cursorPath(conv string) string { return filepath.Join(f.cfg.Dir, conv+".json") }

// cursor returns the id of the last event of conv the control plane
// answered, from memory or from its file. An unreadable file counts as 0
// (everything is sent again and stored once); only a failure to read it
// at all is an error.
func (f *Feed) cursor(conv string) (int64, error) {
	if c := f.cursors[conv]; c != nil {
		return c.taken, nil
	}
	var id int64
	b, err := os.ReadFile(f.cursorPath(conv))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return 0, fmt.Errorf("read report cursor: %w", err)
	default:
		var c cursorFile
		if err := json.Unmarshal(b, &c); err != nil || c.Format != 1 || c.EventID < 0 {
			f.log.Warn("report cursor unreadable; reporting the conversation from its start (the control plane stores each report once)", "conversation", conv)
		} else {
			id = c.EventID
		}
	}
	f.cursors[conv] = &cursor{taken: id, saved: id}
	return id, nil
}

func (f *Feed) advance(conv string, id int64) {
	if c := f.cursors[conv]; c != nil && id > c.taken {
		c.taken = id
	}
}

// forget drops the cursor of a conversation that no longer exists.
func (f *Feed) forget(conv string) {
	delete(f.cursors, conv)
	if err := os.Remove(f.cursorPath(conv)); err != nil && !errors.Is(err, os.ErrNotExist) {
		f.log.Warn("remove the report cursor of a deleted conversation", "conversation", conv, "err", err)
	}
}

// saveCursors writes the cursors that moved since they were last saved, at
// most every cursorSaveEvery unless force, and drops the saved ones from
// memory (the next round reads them from their files again). A cursor that
// cannot be written (a full disk) stays in memory and is tried again.
func (f *Feed) saveCursors(force bool) {
	now := time.Now()
	if !force && now.Sub(f.lastSave) < cursorSaveEvery {
		return
	}
	f.lastSave = now
	for conv, c := range f.cursors {
		if c.taken != c.saved {
			b, _ := json.Marshal(cursorFile{Format: 1, EventID: c.taken})
			if err := atomicfile.WriteFile(f.cursorPath(conv), b, 0o600); err != nil {
				f.log.Error("save report cursor; trying again later (a restart before then sends some reports again)", "conversation", conv, "err", err)
				continue
			}
		}
		delete(f.cursors, conv)
	}
}

// Report is one report of an event: Kind is a contract.ReportKind*
// constant, Body the report's JSON.
type Report struct {
	Kind string
	Key  string
	Body []byte
}

// Reports maps one event to its reports: a tool event for tool_use and
// tool_result, a usage report for turn_completed and turn_failed, and an
// activity entry for every event, in that order.
func Reports(ev contract.Event) []Report {
	key := func(kind string) string { return fmt.Sprintf("%s:%d:%s", ev.ConversationID, ev.ID, kind) }
	var out []Report
	add := func(kind, keyKind string, v any) {
		b, err := json.Marshal(v)
		if err == nil {
			out = append(out, Report{Kind: kind, Key: key(keyKind), Body: b})
		}
	}
	switch ev.Type {
	case contract.EventToolUse:
		var p contract.ToolUse
		if json.Unmarshal(ev.Data, &p) == nil && p.ToolUseID != "" {
			add(contract.ReportKindToolEvent, "tool", contract.ToolEventReport{IdempotencyKey: key("tool"), EventID: ev.ID, Time: ev.Time,
				Phase: contract.ToolPhaseUse, ToolUseID: clip(p.ToolUseID, 200), Name: clip(p.Name, 200), Input: clipJSON(p.Input)})
		}
	case contract.EventToolResult:
		var p contract.ToolResult
		if json.Unmarshal(ev.Data, &p) == nil && p.ToolUseID != "" {
			add(contract.ReportKindToolEvent, "tool", contract.ToolEventReport{IdempotencyKey: key("tool"), EventID: ev.ID, Time: ev.Time,
				Phase: contract.ToolPhaseResult, ToolUseID: clip(p.ToolUseID, 200), Output: clip(p.Content, contract.MaxToolOutput), IsError: p.IsError})
		}
	case contract.EventTurnCompleted:
		var p contract.TurnCompleted
		if json.Unmarshal(ev.Data, &p) == nil {
			add(contract.ReportKindUsage, "usage", contract.UsageReport{IdempotencyKey: key("usage"), EventID: ev.ID, Time: ev.Time,
				ClientMessageID: clip(p.ClientMessageID, 64), Outcome: contract.OutcomeCompleted, Usage: nonNegative(p.Usage),
				CostNanoUSD: max(p.CostNanoUSD, 0), NumTurns: max(p.NumTurns, 0), DurationMS: max(p.DurationMS, 0)})
		}
	case contract.EventTurnFailed:
		var p contract.TurnFailed
		if json.Unmarshal(ev.Data, &p) == nil {
			add(contract.ReportKindUsage, "usage", contract.UsageReport{IdempotencyKey: key("usage"), EventID: ev.ID, Time: ev.Time,
				ClientMessageID: clip(p.ClientMessageID, 64), Outcome: contract.OutcomeFailed, Usage: nonNegative(p.Usage)})
		}
	}
	add(contract.ReportKindActivity, "activity", contract.ActivityReport{IdempotencyKey: key("activity"), EventID: ev.ID, Time: ev.Time,
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

// clip cuts s to at most n bytes on a rune boundary, as text the control
// plane stores (contract.ValidText): invalid UTF-8 and NUL become U+FFFD.
func clip(s string, n int) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
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
