package harness

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/sessionstore"
	"github.com/talkide/talkide/internal/worker/streamjson"
)

// subagentLines returns the stdout lines of a real turn of CLI 2.1.332 in
// which a sub-agent's Bash call asked permission (see package streamjson's
// testdata), without the final result line: the turn's end is not what
// these tests look at.
func subagentLines(t *testing.T) [][]byte {
	t.Helper()
	b, err := os.ReadFile("../streamjson/testdata/subagent.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	return lines[:len(lines)-1]
}

// translate feeds lines to a session as the stdout of its process and
// returns the events emitted and what was written to the process's stdin.
// The session runs no CLI: only the translation of its output is under test.
func translate(t *testing.T, policy string, lines [][]byte) ([]contract.Event, []string) {
	t.Helper()
	var mu sync.Mutex
	var evs []contract.Event
	s, p := lineSession(t, policy, func(ev contract.Event) { mu.Lock(); evs = append(evs, ev); mu.Unlock() })
	for _, l := range lines {
		m, err := streamjson.Parse(l)
		if err != nil {
			t.Fatal(err)
		}
		s.handle(p, m, false)
	}
	var stdin []string
	for len(p.in) > 0 {
		stdin = append(stdin, string(<-p.in))
	}
	mu.Lock()
	defer mu.Unlock()
	return append([]contract.Event(nil), evs...), stdin
}

// lineSession returns a session of conversation "c" on a fresh store,
// running no CLI, with policy, and the process whose stdout lines a test
// hands to s.handle (what it writes to the CLI's stdin is in p.in);
// onEvent, if not nil, gets every stored event.
func lineSession(t *testing.T, policy string, onEvent func(contract.Event)) (*session, *process) {
	t.Helper()
	store, err := sessionstore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	log, _, err := store.OpenEventLog("c")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = log.Close() })
	h := &Harness{store: store, log: slog.New(slog.DiscardHandler), cfg: Config{
		PermissionPolicy: policy, PermissionTimeout: time.Hour, OnEvent: onEvent}}
	s := &session{h: h, conv: "c", log: log, meta: &sessionstore.Meta{ConversationID: "c", UserID: "u"}}
	p := &process{in: make(chan []byte, 64), done: make(chan struct{})}
	s.proc = p
	return s, p
}

// brief is an event as these tests compare it: its type, the call it is
// about and the call's parent (for permission_requested: the call asked
// about, no parent).
func brief(t *testing.T, evs []contract.Event) []string {
	t.Helper()
	var out []string
	for _, ev := range evs {
		switch ev.Type {
		case contract.EventToolUse:
			u := payload[contract.ToolUse](t, ev)
			out = append(out, fmt.Sprintf("tool_use %s %s parent=%s", u.Name, u.ToolUseID, u.ParentToolUseID))
		case contract.EventToolResult:
			r := payload[contract.ToolResult](t, ev)
			out = append(out, fmt.Sprintf("tool_result %s parent=%s", r.ToolUseID, r.ParentToolUseID))
		case contract.EventPermissionRequested:
			out = append(out, "permission_requested "+payload[contract.PermissionRequested](t, ev).ToolUseID)
		default:
			out = append(out, string(ev.Type))
		}
	}
	return out
}

// Ids of the captured turn.
const (
	capturedAgentCall = "toolu_dev_000003170cf64b"
	capturedBashCall  = "toolu_dev_00000688a58ca9"
)

// TestSubagentCallsTranslated: the captured lines become the Agent call,
// the sub-agent's Bash call linked to it, its permission request after its
// tool_use, both results, and the main agent's text; the sub-agent's prompt
// line emits nothing.
func TestSubagentCallsTranslated(t *testing.T) {
	evs, _ := translate(t, PolicyAsk, subagentLines(t))
	want := []string{
		"session_started",
		"tool_use Agent " + capturedAgentCall + " parent=",
		"tool_use Bash " + capturedBashCall + " parent=" + capturedAgentCall,
		"permission_requested " + capturedBashCall,
		"tool_result " + capturedBashCall + " parent=" + capturedAgentCall,
		"tool_result " + capturedAgentCall + " parent=",
		"assistant_text",
	}
	if diff := cmp.Diff(want, brief(t, evs)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	for _, ev := range evs {
		if (ev.Type == contract.EventToolUse || ev.Type == contract.EventToolResult) && strings.Contains(string(ev.Data), capturedAgentCall) &&
			!strings.Contains(string(ev.Data), capturedBashCall) && strings.Contains(string(ev.Data), "parent_tool_use_id") {
			t.Errorf("the main agent's event names a parent: %s", ev.Data)
		}
	}
}

// askedFirst returns subagentLines with the permission request moved
// before the call's assistant line (right after task_started, line 2).
func askedFirst(t *testing.T, lines [][]byte) [][]byte {
	t.Helper()
	var ask int
	for i, l := range lines {
		if bytes.Contains(l, []byte(`"type":"control_request"`)) {
			ask = i
		}
	}
	reordered := append(append(append([][]byte{}, lines[:3]...), lines[ask]), append(append([][]byte{}, lines[3:ask]...), lines[ask+1:]...)...)
	if len(reordered) != len(lines) || !bytes.Contains(reordered[3], []byte("can_use_tool")) {
		t.Fatalf("reordering went wrong: %d lines", len(reordered))
	}
	return reordered
}

// TestSubagentPermissionAskedBeforeItsAssistantLine: should the CLI ask
// permission for a sub-agent's call before printing the call, the harness
// announces the call (with its parent, known from task_started) from the
// request, before the permission_requested event, and does not announce it
// again when the call's line follows. Under "allow" the same holds and the
// CLI is answered at once.
func TestSubagentPermissionAskedBeforeItsAssistantLine(t *testing.T) {
	lines := subagentLines(t)
	reordered := askedFirst(t, lines)

	inOrder, _ := translate(t, PolicyAsk, lines)
	early, _ := translate(t, PolicyAsk, reordered)
	if diff := cmp.Diff(brief(t, inOrder), brief(t, early)); diff != "" {
		t.Errorf("events when permission is asked first (-observed order +asked first):\n%s", diff)
	}
	var in struct{ Command string }
	for _, ev := range early {
		if ev.Type == contract.EventToolUse && strings.Contains(string(ev.Data), capturedBashCall) {
			_ = json.Unmarshal(payload[contract.ToolUse](t, ev).Input, &in)
		}
	}
	if in.Command != "echo sub-x > out.txt && cat out.txt" {
		t.Errorf("tool_use from the permission request: command %q, want the request's", in.Command)
	}

	allowed, stdin := translate(t, PolicyAllow, reordered)
	want := []string{
		"session_started",
		"tool_use Agent " + capturedAgentCall + " parent=",
		"tool_use Bash " + capturedBashCall + " parent=" + capturedAgentCall,
		"tool_result " + capturedBashCall + " parent=" + capturedAgentCall,
		"tool_result " + capturedAgentCall + " parent=",
		"assistant_text",
	}
	if diff := cmp.Diff(want, brief(t, allowed)); diff != "" {
		t.Errorf("events under allow (-want +got):\n%s", diff)
	}
	if len(stdin) != 1 || !strings.Contains(stdin[0], `"behavior":"allow"`) {
		t.Errorf("answers to the CLI under allow: got %q, want one allow", stdin)
	}
}
