package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/platformtest"
)

// TestRetriedSendRunsOnceAndStreamResumes sends the same client message id
// twice and reconnects the stream mid-way with Last-Event-ID.
func TestRetriedSendRunsOnceAndStreamResumes(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{})
	conv := p.NewConversation()
	body := map[string]string{"text": "please run `echo once`", "client_message_id": "msg-1"}
	var first, second contract.SendMessageResponse
	if st := p.Do("POST", "/api/conversations/"+conv+"/messages", body, &first); st != http.StatusAccepted || first.Duplicate {
		t.Fatalf("first send: %d %+v", st, first)
	}
	if st := p.Do("POST", "/api/conversations/"+conv+"/messages", body, &second); st != http.StatusAccepted || !second.Duplicate {
		t.Fatalf("retried send: %d %+v, want 202 duplicate", st, second)
	}
	other := map[string]string{"text": "something else entirely", "client_message_id": "msg-1"}
	if st := p.Do("POST", "/api/conversations/"+conv+"/messages", other, nil); st != http.StatusConflict {
		t.Errorf("the same client_message_id with another text: status %d, want 409 (not a silent duplicate)", st)
	}
	s := p.OpenStream(conv, 0)
	s.Until(60*time.Second, platformtest.TurnEnd)
	all := s.Events
	if len(all) < 4 {
		t.Fatalf("too few events: %s", platformtest.Summary(all))
	}
	// Reconnect after the third event: exactly the rest, in order.
	r := p.OpenStream(conv, 3)
	r.Until(10*time.Second, platformtest.TurnEnd)
	if len(r.Events) != len(all)-3 || r.Events[0].ID != 4 {
		t.Fatalf("resumed stream: got %s, want events 4..%d", platformtest.Summary(r.Events), all[len(all)-1].ID)
	}
	turns := 0
	for _, ev := range all {
		if ev.Type == contract.EventTurnStarted {
			turns++
		}
	}
	if turns != 1 {
		t.Errorf("turns run for one message sent twice: %d, want 1", turns)
	}
}

// TestFinalAPIErrorEndsTheTurnQuickly scripts a permission error from the
// upstream (final for the CLI) and checks the turn fails with the reason,
// without minutes of retries.
func TestFinalAPIErrorEndsTheTurnQuickly(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{})
	conv := p.NewConversation()
	p.Upstream.Script(errResponse(403, "permission_error", "model not enabled for this organisation"))
	s := p.OpenStream(conv, 0)
	p.Send(conv, "hello")
	end := s.Until(3*time.Minute, platformtest.TurnEnd)
	if end.Type != contract.EventTurnFailed {
		t.Fatalf("got %s, want turn_failed", end.Type)
	}
	f := platformtest.Payload[contract.TurnFailed](t, end)
	if f.Reason != contract.FailAPIError || f.APIErrorStatus != 403 || !strings.Contains(f.Message, "model not enabled") {
		t.Errorf("turn_failed: got %+v", f)
	}
	// Quickly means without retries: one model call, no api_retry event
	// (a count, not a clock: the machine may be slow).
	calls := 0
	for _, r := range p.Upstream.Requests() {
		if strings.HasSuffix(r.Path, "/v1/messages") {
			calls++
		}
	}
	if calls != 1 {
		t.Errorf("model calls for a final error: got %d, want 1 (no retries)", calls)
	}
	for _, ev := range s.Events {
		if ev.Type == contract.EventAPIRetry {
			t.Errorf("a final error was retried: %s", ev.Data)
		}
	}
}

// TestAPIRetryIsReported scripts an overloaded answer before a good one and
// checks the CLI's retry reaches the browser as an api_retry event.
func TestAPIRetryIsReported(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{})
	conv := p.NewConversation()
	p.Upstream.Script(errResponse(529, "overloaded_error", "Overloaded"))
	s := p.OpenStream(conv, 0)
	p.Send(conv, "hello there")
	end := s.Until(60*time.Second, platformtest.TurnEnd)
	if end.Type != contract.EventTurnCompleted {
		t.Fatalf("got %s %s, want turn_completed after a retry", end.Type, end.Data)
	}
	var retry *contract.APIRetry
	for _, ev := range s.Events {
		if ev.Type == contract.EventAPIRetry {
			r := platformtest.Payload[contract.APIRetry](t, ev)
			retry = &r
		}
	}
	if retry == nil || retry.ErrorStatus != 529 || retry.Attempt != 1 {
		t.Errorf("api_retry: got %+v, want attempt 1 status 529", retry)
	}
}

// TestInterruptStopsAStreamingTurn interrupts a turn while the model is
// still streaming; the turn fails as interrupted and the conversation goes on.
func TestInterruptStopsAStreamingTurn(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{})
	conv := p.NewConversation()
	p.Upstream.Script(devupstream.Response{
		Content:    []devupstream.ContentBlock{devupstream.Text(strings.Repeat("slowly ", 50))},
		EventDelay: 200 * time.Millisecond,
	})
	s := p.OpenStream(conv, 0)
	p.Send(conv, "tell me a long story")
	// Interrupt once the model call is streaming.
	deadline := time.Now().Add(30 * time.Second)
	for !hasMessagesCall(p) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	var ir contract.InterruptResponse
	for !ir.Interrupted && time.Now().Before(deadline) {
		if st := p.Do("POST", "/api/conversations/"+conv+"/interrupt", nil, &ir); st != http.StatusAccepted {
			t.Fatalf("interrupt: status %d", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !ir.Interrupted {
		t.Fatal("interrupt never found a running turn")
	}
	end := s.Until(30*time.Second, platformtest.TurnEnd)
	if f := platformtest.Payload[contract.TurnFailed](t, end); end.Type != contract.EventTurnFailed || f.Reason != contract.FailInterrupted || strings.Contains(f.Message, "diagnostic") {
		t.Fatalf("got %s %s, want turn_failed interrupted with a message for people", end.Type, end.Data)
	}
	p.Send(conv, "please run `echo after-interrupt`")
	end = s.Until(60*time.Second, platformtest.TurnEnd)
	if end.Type != contract.EventTurnCompleted || !strings.Contains(string(end.Data), "after-interrupt") {
		t.Errorf("turn after the interrupt: got %s %s", end.Type, end.Data)
	}
}

func hasMessagesCall(p *platformtest.Platform) bool {
	for _, r := range p.Upstream.Requests() {
		if r.Path == "/v1/messages" {
			return true
		}
	}
	return false
}

// TestSessionCreatedLateKeepsTheModel guards against losing the model chosen
// at creation when the worker did not get the session then: the first
// message creates it with the stored model.
func TestSessionCreatedLateKeepsTheModel(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{})
	p.CreateConversationInDB("late-conv", "claude-sonnet-5-5")
	s := p.OpenStream("late-conv", 0)
	p.Send("late-conv", "hello")
	end := s.Until(60*time.Second, platformtest.TurnEnd)
	if end.Type != contract.EventTurnCompleted {
		t.Fatalf("got %s %s", end.Type, end.Data)
	}
	var models []string
	for _, r := range p.Upstream.Requests() {
		if r.Path == "/v1/messages" {
			models = append(models, string(r.Body))
		}
	}
	if len(models) == 0 || !strings.Contains(models[0], `"model":"claude-sonnet-5-5"`) {
		t.Errorf("upstream did not get the stored model")
	}
}
