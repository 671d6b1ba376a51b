package reportfeed

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/worker/outbox"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

func sampleEvents(conv string) []contract.Event {
	long := strings.Repeat("é", contract.MaxToolOutput) // over the limit in bytes
	ps := []struct {
		t contract.EventType
		p any
	}{
		{contract.EventSessionStarted, contract.SessionStarted{SessionID: "s", Model: "m"}},
		{contract.EventUserMessage, contract.UserMessage{ClientMessageID: "m1", Text: "please\nrun `ls`"}},
		{contract.EventTurnStarted, contract.TurnStarted{ClientMessageID: "m1"}},
		{contract.EventToolUse, contract.ToolUse{ToolUseID: "t1", Name: "Bash", Input: json.RawMessage(`{"command":"` + strings.Repeat("x", contract.MaxToolInput) + `"}`)}},
		{contract.EventToolResult, contract.ToolResult{ToolUseID: "t1", Content: long, IsError: true}},
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
			want[rep.Path]++
			var v interface{ Validate() error }
			switch rep.Path {
			case contract.PathReportToolEvents:
				v = &contract.ToolEventReport{}
			case contract.PathReportUsage:
				v = &contract.UsageReport{}
			case contract.PathReportActivity:
				v = &contract.ActivityReport{}
			default:
				t.Fatalf("unexpected path %s", rep.Path)
			}
			if err := httpapi.DecodeJSON(r, rep.Body, v); err != nil {
				t.Fatalf("%s: %v", rep.Body, err)
			}
			if err := v.Validate(); err != nil {
				t.Errorf("event %s: report %s refused: %v", ev.Type, rep.Path, err)
			}
			if !strings.HasPrefix(rep.Key, fmt.Sprintf("c1:%d:", ev.ID)) {
				t.Errorf("key %q not derived from the event id", rep.Key)
			}
		}
	}
	if want[contract.PathReportActivity] != 12 || want[contract.PathReportToolEvents] != 2 || want[contract.PathReportUsage] != 2 {
		t.Errorf("reports per path: %v", want)
	}
}

// recorder is an outbox.Sender that stores keys once, in arrival order.
type recorder struct {
	mu   sync.Mutex
	keys []string
	seen map[string]int
}

func (r *recorder) Send(_ context.Context, e outbox.Entry) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[string]int{}
	}
	r.seen[e.Key]++
	if r.seen[e.Key] == 1 {
		r.keys = append(r.keys, e.Key)
	}
	return []byte(`{}`), nil
}

type logs struct{ store *sessionstore.Store }

func (l logs) Events(conv string) (*sessionstore.EventLog, error) {
	el, _, err := l.store.OpenEventLog(conv)
	return el, err
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
	start := func() (*Feed, func()) {
		ob, err := outbox.Open(outbox.Config{Dir: filepath.Join(dir, "outbox"), Sender: rec, MinBackoff: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		f, err := New(Config{Outbox: ob, Logs: logs{store}, List: store.List, Dir: filepath.Join(dir, "cursors"), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { ob.Run(ctx) })
		wg.Go(func() { f.Run(ctx) })
		return f, func() { cancel(); wg.Wait() }
	}
	waitKeys := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			rec.mu.Lock()
			got := len(rec.keys)
			rec.mu.Unlock()
			if got >= n {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
		t.Fatalf("got %d reports, want %d", len(rec.keys), n)
	}
	_, stop := start()
	waitKeys(5) // 4 activity + 1 tool
	stop()
	// Events stored while the worker was down are caught up on start.
	for _, ev := range sampleEvents("c1")[4:8] {
		el.Append(ev)
	}
	f, stop := start()
	waitKeys(11) // + 4 activity, 1 tool, 1 usage
	// And new ones follow a Notify.
	ev, _ := el.Append(sampleEvents("c1")[8])
	f.Notify(ev)
	waitKeys(13)
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
