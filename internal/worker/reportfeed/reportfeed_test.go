package reportfeed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

func sampleEvents(conv string) []contract.Event {
	long := strings.Repeat("é", contract.MaxToolOutput) // over the limit in bytes
	ps := []struct {
		t contract.EventType
		p any
	}{
		{contract.EventSessionStarted, contract.SessionStarted{SessionID: "s", Model: "m"}},
		// A NUL, which PostgreSQL cannot store: the report must carry text
		// the control plane accepts, not be refused on every try.
		{contract.EventUserMessage, contract.UserMessage{ClientMessageID: "m1", Text: "please\nrun `ls`\x00"}},
		{contract.EventTurnStarted, contract.TurnStarted{ClientMessageID: "m1"}},
		{contract.EventToolUse, contract.ToolUse{ToolUseID: "t1", Name: "Bash", Input: json.RawMessage(`{"command":"` + strings.Repeat("x", contract.MaxToolInput) + `"}`)}},
		{contract.EventToolResult, contract.ToolResult{ToolUseID: "t1", Content: "\x00" + long, IsError: true}},
		{contract.EventAPIRetry, contract.APIRetry{Attempt: 1, MaxRetries: 10, ErrorStatus: 529}},
		{contract.EventAssistantText, contract.AssistantText{MessageID: "msg", Text: "done"}},
		{contract.EventTurnCompleted, contract.TurnCompleted{ClientMessageID: "m1", Usage: contract.Usage{InputTokens: 5}, CostNanoUSD: 7}},
		{contract.EventTurnFailed, contract.TurnFailed{ClientMessageID: "m2", Reason: contract.FailAPIError, Message: "x"}},
		{contract.EventError, contract.ErrorEvent{Code: "c", Message: "m"}},
		{contract.EventSessionStopped, contract.SessionStopped{Reason: "idle"}},
		{contract.EventMCPServerRefused, contract.MCPServerRefused{Server: "db", Reason: "no"}},
	}
	var out []contract.Event
	for i, p := range ps {
		ev, _ := contract.NewEvent(conv, p.t, p.p)
		ev.ID = int64(i + 1)
		out = append(out, ev)
	}
	return out
}

// TestReportsPassTheControlPlanesValidation: whatever the events hold, the
// reports the feed makes are accepted by the control plane's decoding and
// validation (clipped to the limits, not refused).
func TestReportsPassTheControlPlanesValidation(t *testing.T) {
	r, _ := http.NewRequest("POST", "/", nil)
	want := map[string]int{}
	for _, ev := range sampleEvents("c1") {
		for _, rep := range Reports(ev) {
			want[rep.Kind]++
			var v interface{ Validate() error }
			switch rep.Kind {
			case contract.ReportKindToolEvent:
				v = &contract.ToolEventReport{}
			case contract.ReportKindUsage:
				v = &contract.UsageReport{}
			case contract.ReportKindActivity:
				v = &contract.ActivityReport{}
			default:
				t.Fatalf("unexpected kind %s", rep.Kind)
			}
			if err := httpapi.DecodeJSON(r, rep.Body, v); err != nil {
				t.Fatalf("%s: %v", rep.Body, err)
			}
			if err := v.Validate(); err != nil {
				t.Errorf("event %s: report %s refused: %v", ev.Type, rep.Kind, err)
			}
			if !strings.HasPrefix(rep.Key, fmt.Sprintf("c1:%d:", ev.ID)) {
				t.Errorf("key %q not derived from the event id", rep.Key)
			}
		}
	}
	if want[contract.ReportKindActivity] != 12 || want[contract.ReportKindToolEvent] != 2 || want[contract.ReportKindUsage] != 2 {
		t.Errorf("reports per path: %v", want)
	}
}

// recorder is a Sender that stores keys once, in arrival order, and can
// be told to fail requests or groups.
type recorder struct {
	mu       sync.Mutex
	keys     []string
	seen     map[string]int
	requests int
	// fail, when set, decides a request's fate before anything is stored:
	// a non-nil error fails the request whole.
	fail func(n int, groups []Group) error
	// group, when set, may answer a group instead of storing it.
	group func(g Group) (GroupResult, bool)
}

func (r *recorder) SendReports(_ context.Context, groups []Group) ([]GroupResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	if r.fail != nil {
		if err := r.fail(r.requests, groups); err != nil {
			return nil, err
		}
	}
	if r.seen == nil {
		r.seen = map[string]int{}
	}
	out := make([]GroupResult, len(groups))
	for i, g := range groups {
		if r.group != nil {
			if res, ok := r.group(g); ok {
				out[i] = res
				continue
			}
		}
		for _, rep := range g.Reports {
			r.seen[rep.Key]++
			if r.seen[rep.Key] == 1 {
				r.keys = append(r.keys, rep.Key)
			}
		}
	}
	return out, nil
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.keys)
}

func (r *recorder) waitKeys(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if r.count() >= n {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("got %d reports, want %d", r.count(), n)
}

type logs struct{ store *sessionstore.Store }

func (l logs) Events(conv string) (*sessionstore.EventLog, error) {
	if _, err := l.store.LoadMeta(conv); err != nil {
		return nil, err
	}
	return l.store.OpenEventLogReader(conv)
}

// startFeed runs a feed over store with sender until the returned stop.
func startFeed(t *testing.T, dir string, store *sessionstore.Store, sender Sender, log *slog.Logger) (*Feed, func()) {
	t.Helper()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f, err := New(Config{Sender: sender, Logs: logs{store}, List: store.List, Dir: filepath.Join(dir, "cursors"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { f.Run(ctx) })
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return f, stop
}

func TestFeedFollowsLogsAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	store, _ := sessionstore.Open(filepath.Join(dir, "store"))
	el, _, _ := store.OpenEventLog("c1")
	store.SaveMeta(&sessionstore.Meta{ConversationID: "c1"})
	for _, ev := range sampleEvents("c1")[:4] {
		el.Append(ev)
	}
	rec := &recorder{}
	_, stop := startFeed(t, dir, store, rec, nil)
	rec.waitKeys(t, 5) // 4 activity + 1 tool
	stop()
	// Events stored while the worker was down are caught up on start.
	for _, ev := range sampleEvents("c1")[4:8] {
		el.Append(ev)
	}
	f, stop := startFeed(t, dir, store, rec, nil)
	rec.waitKeys(t, 11) // + 4 activity, 1 tool, 1 usage
	// And new ones follow a Notify.
	ev, _ := el.Append(sampleEvents("c1")[8])
	f.Notify(ev)
	rec.waitKeys(t, 13)
	stop()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var order []string
	for _, k := range rec.keys {
		if rec.seen[k] != 1 {
			t.Errorf("%s sent %d times", k, rec.seen[k])
		}
		order = append(order, k)
	}
	want := "c1:1:activity c1:2:activity c1:3:activity c1:4:tool c1:4:activity c1:5:tool c1:5:activity c1:6:activity c1:7:activity c1:8:usage c1:8:activity c1:9:usage c1:9:activity"
	if got := strings.Join(order, " "); got != want {
		t.Errorf("order:\n got %s\nwant %s", got, want)
	}
}

// appendN stores n assistant lines in conv's log.
func appendN(t *testing.T, store *sessionstore.Store, conv string, n int) *sessionstore.EventLog {
	t.Helper()
	if err := store.SaveMeta(&sessionstore.Meta{ConversationID: conv}); err != nil {
		t.Fatal(err)
	}
	el, _, err := store.OpenEventLog(conv)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		ev, _ := contract.NewEvent(conv, contract.EventAssistantText, contract.AssistantText{Text: fmt.Sprint("line ", i)})
		if _, err := el.Append(ev); err != nil {
			t.Fatal(err)
		}
	}
	return el
}

// TestFeedBatchesConversations guards against the per-event cost the feed
// had: every event's report was its own fsynced outbox file and its own
// request and transaction (a third of the worker's CPU and half the control
// plane's with 200 active agents). Reports of many conversations now share
// a request, each conversation's in order, and nothing is sent twice.
func TestFeedBatchesConversations(t *testing.T) {
	dir := t.TempDir()
	store, _ := sessionstore.Open(filepath.Join(dir, "store"))
	const convs, per = 60, 30
	for c := range convs {
		appendN(t, store, fmt.Sprintf("c%02d", c), per)
	}
	rec := &recorder{}
	_, stop := startFeed(t, dir, store, rec, nil)
	rec.waitKeys(t, convs*per)
	stop()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	// 1,800 reports: two requests' worth at contract.MaxReportBatchReports.
	if rec.requests > 3 {
		t.Errorf("%d reports of %d conversations took %d requests, want at most 3", convs*per, convs, rec.requests)
	}
	next := map[string]int{}
	for _, k := range rec.keys {
		if rec.seen[k] != 1 {
			t.Errorf("%s sent %d times", k, rec.seen[k])
		}
		var conv string
		var id int
		if _, err := fmt.Sscanf(strings.ReplaceAll(k, ":", " "), "%s %d", &conv, &id); err != nil {
			t.Fatalf("key %q: %v", k, err)
		}
		if id != next[conv]+1 {
			t.Fatalf("%s: event %d reported after %d", conv, id, next[conv])
		}
		next[conv] = id
	}
}

// TestFeedRetriesFailedRequestsAndGroups: a request that fails whole (the
// control plane unreachable) and a group that fails (a token refused) are
// sent again with no new event; a conversation the mint refuses for good and
// a report the control plane refuses are dropped with a log line, and the
// conversation's next reports follow.
func TestFeedRetriesFailedRequestsAndGroups(t *testing.T) {
	dir := t.TempDir()
	store, _ := sessionstore.Open(filepath.Join(dir, "store"))
	appendN(t, store, "ok", 3)
	appendN(t, store, "flaky", 3)
	appendN(t, store, "refused", 3)
	appendN(t, store, "onebad", 3)
	flakyTries := 0
	rec := &recorder{
		fail: func(n int, _ []Group) error {
			if n <= 2 {
				return errors.New("connection refused")
			}
			return nil
		},
		group: func(g Group) (GroupResult, bool) {
			switch g.Conversation {
			case "flaky":
				flakyTries++
				if flakyTries == 1 {
					return GroupResult{Err: errors.New("control plane: 401 unauthorized")}, true
				}
			case "refused":
				return GroupResult{Err: errors.New("mint: 403 conversation not in this tenant-env"), Permanent: true}, true
			case "onebad":
				if g.Reports[0].Key == "onebad:1:activity" {
					return GroupResult{Refused: []string{"onebad:1:activity: 409"}}, true
				}
			}
			return GroupResult{}, false
		},
	}
	f, stop := startFeed(t, dir, store, rec, nil)
	rec.waitKeys(t, 6) // ok's 3 and flaky's 3, after two failed requests and one failed group
	// onebad's first batch was answered (one refused, the others taken as
	// the recorder says nothing of them): its cursor moved past all three.
	ev, _, _ := store.OpenEventLog("onebad")
	e, _ := contract.NewEvent("onebad", contract.EventAssistantText, contract.AssistantText{Text: "after"})
	e, _ = ev.Append(e)
	f.Notify(e)
	rec.waitKeys(t, 7)
	stop()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.seen["onebad:4:activity"] != 1 || rec.seen["refused:1:activity"] != 0 {
		t.Errorf("seen: %v", rec.seen)
	}
	for k, n := range rec.seen {
		if n != 1 {
			t.Errorf("%s sent %d times", k, n)
		}
	}
}

// TestFeedForgetsDeletedConversations: a conversation deleted with events
// not yet reported loses its cursor and is not retried.
func TestFeedForgetsDeletedConversations(t *testing.T) {
	dir := t.TempDir()
	store, _ := sessionstore.Open(filepath.Join(dir, "store"))
	appendN(t, store, "gone", 2)
	appendN(t, store, "kept", 2)
	rec := &recorder{}
	_, stop := startFeed(t, dir, store, rec, nil)
	rec.waitKeys(t, 4)
	stop() // saves both cursors
	if _, err := os.Stat(filepath.Join(dir, "cursors", "gone.json")); err != nil {
		t.Fatalf("cursor of gone: %v", err)
	}
	el, _, _ := store.OpenEventLog("gone")
	el.Append(contract.Event{Type: contract.EventAssistantText})
	el.Close()
	if err := store.Delete("gone"); err != nil {
		t.Fatal(err)
	}
	var errs atomicCount
	f, stop := startFeed(t, dir, store, rec, slog.New(errorSignal{errs.add}))
	f.Notify(contract.Event{ConversationID: "gone"})
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "cursors", "gone.json")); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the deleted conversation's cursor is still there")
		}
	}
	stop()
	if n := errs.load(); n > 0 {
		t.Errorf("%d error lines for a deleted conversation", n)
	}
}

// TestUnreadableCursorSendsAgainFromTheStart: a cursor file cut short by a
// crash (saved without waiting for the disk) makes the feed send the
// conversation's reports again, which the control plane stores once;
// nothing is skipped.
func TestUnreadableCursorSendsAgainFromTheStart(t *testing.T) {
	dir := t.TempDir()
	store, _ := sessionstore.Open(filepath.Join(dir, "store"))
	appendN(t, store, "c1", 3)
	rec := &recorder{}
	_, stop := startFeed(t, dir, store, rec, nil)
	rec.waitKeys(t, 3)
	stop()
	if err := os.WriteFile(filepath.Join(dir, "cursors", "c1.json"), []byte(`{"form`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, stop = startFeed(t, dir, store, rec, nil)
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec.mu.Lock()
		n := rec.seen["c1:3:activity"]
		rec.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("c1:3 sent %d times, want 2 (again after the cursor was lost)", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
}

// TestActivityNamesWhatAPermissionOrBuildIsAbout: the control plane's
// conversation list counts pending permission requests by the activity
// entries' ref, so requested and resolved must carry the request id.
func TestActivityNamesWhatAPermissionOrBuildIsAbout(t *testing.T) {
	for _, tc := range []struct {
		t    contract.EventType
		p    any
		want string
	}{
		{contract.EventPermissionRequested, contract.PermissionRequested{RequestID: "req-1", ToolName: "Bash"}, "req-1"},
		{contract.EventPermissionResolved, contract.PermissionResolved{RequestID: "req-1", Behavior: "deny"}, "req-1"},
		{contract.EventBuildCompleted, map[string]string{"build_id": "toolu_1"}, "toolu_1"},
		{contract.EventToolUse, contract.ToolUse{ToolUseID: "t1", Name: "Bash"}, ""},
	} {
		ev, _ := contract.NewEvent("c", tc.t, tc.p)
		ev.ID = 3
		reps := Reports(ev)
		var a contract.ActivityReport
		if err := json.Unmarshal(reps[len(reps)-1].Body, &a); err != nil {
			t.Fatal(err)
		}
		if a.Ref != tc.want {
			t.Errorf("%s: ref %q, want %q", tc.t, a.Ref, tc.want)
		}
	}
}

// TestAStuckConversationDelaysNoOther: a conversation whose reports the
// control plane cannot store (its group fails on every try) was sent again
// at every other conversation's event, and its failures delayed everyone's
// reports by the shared backoff. Now it backs off alone: it is tried a few
// times, not once per event elsewhere, and the busy conversation's reports
// keep flowing.
func TestAStuckConversationDelaysNoOther(t *testing.T) {
	dir := t.TempDir()
	store, _ := sessionstore.Open(filepath.Join(dir, "store"))
	appendN(t, store, "stuck", 1)
	busy := appendN(t, store, "busy", 0)
	var stuckTries int
	rec := &recorder{group: func(g Group) (GroupResult, bool) {
		if g.Conversation == "stuck" {
			stuckTries++
			return GroupResult{Err: errors.New("report stuck:1:activity: control plane: 500")}, true
		}
		return GroupResult{}, false
	}}
	f, stop := startFeed(t, dir, store, rec, nil)
	const events = 100
	for i := range events {
		ev, _ := contract.NewEvent("busy", contract.EventAssistantText, contract.AssistantText{Text: fmt.Sprint(i)})
		ev, _ = busy.Append(ev)
		f.Notify(ev)
		time.Sleep(10 * time.Millisecond)
	}
	rec.waitKeys(t, events)
	stop()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	// About a second of events: backoffs of 100, 200, 400 and 800 ms allow
	// five tries, the last flush one more.
	if stuckTries > 8 {
		t.Errorf("the stuck conversation was sent %d times during %d events elsewhere", stuckTries, events)
	}
}

// TestReportsTheLogNoLongerHoldsAreCounted: a conversation whose event log
// dropped its oldest events (its retention bound) while the control plane
// was behind cannot report them; the gap is logged and counted, not silent.
func TestReportsTheLogNoLongerHoldsAreCounted(t *testing.T) {
	dir := t.TempDir()
	store, _ := sessionstore.Open(filepath.Join(dir, "store"))
	store.KeepEvents = 10
	appendN(t, store, "c1", 40)
	rec := &recorder{}
	var warned atomic.Bool
	log := slog.New(warnSignal{func(r slog.Record) {
		if strings.Contains(r.Message, "no longer holds") {
			warned.Store(true)
		}
	}})
	f, stop := startFeed(t, dir, store, rec, log)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		rec.mu.Lock()
		n, kept := rec.seen["c1:40:activity"], len(rec.keys)
		rec.mu.Unlock()
		if n == 1 {
			if kept >= 40 {
				t.Fatalf("%d reports of 40 events: the log was not compacted", kept)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the last event was never reported")
		}
	}
	stop()
	if !warned.Load() {
		t.Error("the oldest events were never reported and nothing said so")
	}
	// Every event is either reported or counted as skipped.
	rec.mu.Lock()
	reported := len(rec.keys)
	rec.mu.Unlock()
	var m dto.Metric
	if err := f.cfg.Metrics.skipped.Write(&m); err != nil {
		t.Fatal(err)
	}
	if skipped := m.GetCounter().GetValue(); int(skipped)+reported != 40 {
		t.Errorf("%d events reported and %v counted as skipped, want 40 in all", reported, skipped)
	}
}

// TestStoppingSendsTheLastEvents: events stored just before the worker
// stops are sent before the feed ends, not at the next start.
func TestStoppingSendsTheLastEvents(t *testing.T) {
	dir := t.TempDir()
	store, _ := sessionstore.Open(filepath.Join(dir, "store"))
	el := appendN(t, store, "c1", 1)
	rec := &recorder{}
	f, stop := startFeed(t, dir, store, rec, nil)
	rec.waitKeys(t, 1)
	ev, _ := contract.NewEvent("c1", contract.EventSessionStopped, contract.SessionStopped{Reason: "shutdown"})
	ev, _ = el.Append(ev)
	f.Notify(ev)
	stop()
	if rec.count() != 2 {
		t.Errorf("reports at stop: %d, want 2 (the last event's too)", rec.count())
	}
}

// warnSignal is a slog handler that calls f for every warning or error.
type warnSignal struct{ f func(slog.Record) }

func (h warnSignal) Enabled(_ context.Context, l slog.Level) bool  { return l >= slog.LevelWarn }
func (h warnSignal) Handle(_ context.Context, r slog.Record) error { h.f(r); return nil }
func (h warnSignal) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h warnSignal) WithGroup(string) slog.Handler                 { return h }
