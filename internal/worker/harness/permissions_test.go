package harness

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/devupstream"
)

// waitEvent waits for the first event of type typ (after index from) and
// returns it with its index.
func waitEvent(t *testing.T, e *events, typ contract.EventType, from int, timeout time.Duration) (contract.Event, int) {
	t.Helper()
	var got contract.Event
	idx := -1
	waitFor(t, string(typ), timeout, func() bool {
		for i, ev := range e.snapshot() {
			if i >= from && ev.Type == typ {
				got, idx = ev, i
				return true
			}
		}
		return false
	})
	return got, idx
}

func payload[T any](t *testing.T, ev contract.Event) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(ev.Data, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestPermissionRequests runs the "ask" policy through allow, deny, a
// timeout, and answers to unknown and already resolved requests.
func TestPermissionRequests(t *testing.T) {
	r := startRig(t, rigOptions{policy: PolicyAsk, permTimeout: 2 * time.Second})
	type tc struct {
		conv, cmd, answer string
	}
	for _, c := range []tc{{"allow", "echo allowed-run > out.txt && cat out.txt", "allow"}, {"deny", "echo denied-run > out.txt", "deny"}, {"timeout", "echo late-run > out.txt", ""}} {
		t.Run(c.conv, func(t *testing.T) {
			mustCreate(t, r.h, c.conv)
			e := r.follow(t, c.conv)
			mustSend(t, r.h, c.conv, "m1", "please run `"+c.cmd+"`")
			req, _ := waitEvent(t, e, contract.EventPermissionRequested, 0, 60*time.Second)
			pr := payload[contract.PermissionRequested](t, req)
			var in struct{ Command string }
			_ = json.Unmarshal(pr.Input, &in)
			if pr.ToolName != "Bash" || in.Command != c.cmd || pr.ExpiresAt.IsZero() {
				t.Fatalf("permission_requested: %+v", pr)
			}
			if c.answer != "" {
				res, err := r.h.AnswerPermission(c.conv, pr.RequestID, contract.PermissionAnswer{Behavior: c.answer, Message: "not today"})
				if err != nil || res.Behavior != c.answer {
					t.Fatalf("answer: %+v, %v", res, err)
				}
			}
			end, _ := waitEvent(t, e, contract.EventTurnCompleted, 0, 60*time.Second)
			resolved, _ := waitEvent(t, e, contract.EventPermissionResolved, 0, 5*time.Second)
			rs := payload[contract.PermissionResolved](t, resolved)
			result, _ := waitEvent(t, e, contract.EventToolResult, 0, 5*time.Second)
			tr := payload[contract.ToolResult](t, result)
			switch c.answer {
			case "allow":
				if tr.IsError || !strings.Contains(tr.Content, "allowed-run") || rs.Reason != "answered" {
					t.Errorf("allowed call: result %+v, resolved %+v", tr, rs)
				}
			case "deny":
				if !tr.IsError || !strings.Contains(tr.Content, "not today") || rs.Behavior != "deny" {
					t.Errorf("denied call: result %+v, resolved %+v", tr, rs)
				}
			default:
				if !tr.IsError || rs.Reason != "timeout" || rs.Behavior != "deny" {
					t.Errorf("unanswered call: result %+v, resolved %+v", tr, rs)
				}
			}
			_ = end
			if _, err := r.h.AnswerPermission(c.conv, pr.RequestID, contract.PermissionAnswer{Behavior: "allow"}); !errors.Is(err, ErrPermissionResolved) {
				t.Errorf("answering again: got %v, want ErrPermissionResolved", err)
			}
		})
	}
	if _, err := r.h.AnswerPermission("allow", "perm_nope", contract.PermissionAnswer{Behavior: "allow"}); !errors.Is(err, ErrPermissionNotFound) {
		t.Errorf("unknown request: got %v, want ErrPermissionNotFound", err)
	}
	if _, err := r.h.AnswerPermission("allow", "perm_nope", contract.PermissionAnswer{Behavior: "maybe"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad behavior: got %v, want ErrInvalid", err)
	}
}

// TestPermissionRequestSurvivesACrash cuts the worker (without any clean-up
// write, as SIGKILL would) while a permission request is pending; the next
// incarnation raises it again with the same id, the answer to it applies to
// the repeated call, and the turn completes.
func TestPermissionRequestSurvivesACrash(t *testing.T) {
	vol := t.TempDir()
	up := devupstream.New(devupstream.Config{})
	call := devupstream.Response{Content: []devupstream.ContentBlock{devupstream.ToolUse("Bash", map[string]any{"command": "echo after-crash > out.txt && cat out.txt"})}, StopReason: "tool_use"}
	up.Script(call, call) // the first ask, and the repeat after the restart
	a := startRig(t, rigOptions{volume: vol, holder: "replica-a", upstream: up, policy: PolicyAsk, permTimeout: time.Minute})
	mustCreate(t, a.h, "c")
	ea := a.follow(t, "c")
	mustSend(t, a.h, "c", "m1", "do the thing")
	req, _ := waitEvent(t, ea, contract.EventPermissionRequested, 0, 60*time.Second)
	id := payload[contract.PermissionRequested](t, req).RequestID

	a.crash() // the process is killed and nothing more is written

	b := startRig(t, rigOptions{volume: vol, holder: "replica-a", upstream: up, policy: PolicyAsk, permTimeout: time.Minute})
	if _, err := b.h.Recover(); err != nil {
		t.Fatal(err)
	}
	eb := b.follow(t, "c")
	again, i := waitEvent(t, eb, contract.EventPermissionRequested, len(ea.snapshot()), 30*time.Second)
	pr := payload[contract.PermissionRequested](t, again)
	if pr.RequestID != id || !pr.Reraised {
		t.Fatalf("after the crash: %+v, want request %s raised again", pr, id)
	}
	if _, err := b.h.AnswerPermission("c", id, contract.PermissionAnswer{Behavior: "allow"}); err != nil {
		t.Fatal(err)
	}
	end, _ := waitEvent(t, eb, contract.EventTurnCompleted, i, 60*time.Second)
	result, _ := waitEvent(t, eb, contract.EventToolResult, i, 5*time.Second)
	if tr := payload[contract.ToolResult](t, result); tr.IsError || !strings.Contains(tr.Content, "after-crash") {
		t.Errorf("repeated call: %+v", tr)
	}
	if done := payload[contract.TurnCompleted](t, end); done.ClientMessageID != "m1" {
		t.Errorf("continued turn completed as %q, want m1", done.ClientMessageID)
	}
	for _, ev := range eb.snapshot() {
		if ev.Type == contract.EventTurnFailed {
			t.Errorf("the turn failed instead of continuing: %s", ev.Data)
		}
	}
}

// TestInterruptBeforeTheCLIStarted interrupts a turn whose CLI process has
// only just been started (no output yet): the interrupt is not a silent
// no-op, and the turn ends within the interrupt timeout even though the
// model call would stream for a long time.
func TestInterruptBeforeTheCLIStarted(t *testing.T) {
	up := devupstream.New(devupstream.Config{})
	up.Script(devupstream.Response{Content: []devupstream.ContentBlock{devupstream.Text(strings.Repeat("slow ", 200))}, EventDelay: 500 * time.Millisecond})
	r := startRig(t, rigOptions{upstream: up})
	r.h.cfg.InterruptTimeout = 3 * time.Second
	mustCreate(t, r.h, "c")
	e := r.follow(t, "c")
	mustSend(t, r.h, "c", "m1", "tell me a long story")
	start := time.Now()
	ok, err := r.h.Interrupt("c")
	if err != nil || !ok {
		t.Fatalf("interrupt right after the send: %v, %v; want true", ok, err)
	}
	end, _ := waitEvent(t, e, contract.EventTurnFailed, 0, 20*time.Second)
	if f := payload[contract.TurnFailed](t, end); f.Reason != contract.FailInterrupted {
		t.Errorf("turn ended with %+v, want interrupted", f)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("interrupted turn took %s to end", d)
	}
	if ok, _ := r.h.Interrupt("c"); ok {
		t.Error("interrupt with no running turn reported a running turn")
	}
}

// TestTurnCostAfterACrash guards against per-turn costs measured from the
// wrong base after a crash: the resumed CLI counts from the transcript's
// last cost-state, not from the last total the worker saw.
func TestTurnCostAfterACrash(t *testing.T) {
	vol := t.TempDir()
	up := devupstream.New(devupstream.Config{})
	a := startRig(t, rigOptions{volume: vol, holder: "replica-a", upstream: up})
	mustCreate(t, a.h, "c")
	ea := a.follow(t, "c")
	mustSend(t, a.h, "c", "m1", "hello there")
	first, _ := waitEvent(t, ea, contract.EventTurnCompleted, 0, 60*time.Second)
	// A clean stop writes a cost-state record; the crash below writes none,
	// so the transcript's last one is older than the worker's last total.
	if _, err := a.h.Stop("c"); err != nil {
		t.Fatal(err)
	}
	mustSend(t, a.h, "c", "m2", "hello again")
	var second contract.Event
	waitFor(t, "second turn", 60*time.Second, func() bool {
		n := 0
		for _, ev := range ea.snapshot() {
			if ev.Type == contract.EventTurnCompleted {
				n++
				second = ev
			}
		}
		return n == 2
	})
	a.crash() // no clean exit, so no new cost-state record
	b := startRig(t, rigOptions{volume: vol, holder: "replica-a", upstream: up})
	eb := b.follow(t, "c")
	mustSend(t, b.h, "c", "m3", "and once more")
	third, _ := waitEvent(t, eb, contract.EventTurnCompleted, len(ea.snapshot()), 60*time.Second)
	c1 := payload[contract.TurnCompleted](t, first).CostNanoUSD
	c2 := payload[contract.TurnCompleted](t, second).CostNanoUSD
	c3 := payload[contract.TurnCompleted](t, third).CostNanoUSD
	// The three turns send about the same tokens; the third a bit more.
	if c1 <= 0 || c2 < c1/2 || c3 < c1/2 || c3 > 3*c1 {
		t.Errorf("turn costs %d, %d, %d nano-USD: want each close to the first", c1, c2, c3)
	}
}
