package e2e

import (
	"bytes"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/worker"
)

// syncBuffer is a bytes.Buffer safe for concurrent log writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(with string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range strings.Split(s.b.String(), "\n") {
		if strings.Contains(l, with) {
			out = append(out, l)
		}
	}
	return out
}

// TestBrowserErrorFindsItsLogLines: a browser request the worker refuses
// answers an error whose request id finds the request's lines in the
// control plane's log and in the worker's, which got the id with the
// control plane's call.
func TestBrowserErrorFindsItsLogLines(t *testing.T) {
	var cpLog, wLog syncBuffer
	p := platformtest.Start(t, platformtest.Options{
		ControlPlane: func(c *controlplane.Config) { c.Logger = slog.New(slog.NewJSONHandler(&cpLog, nil)) },
		Worker:       func(c *worker.Config) { c.Logger = slog.New(slog.NewJSONHandler(&wLog, nil)) },
	})
	conv := p.NewConversation()
	// An answer to a permission request that does not exist: the control
	// plane passes it on, the worker answers 404.
	code, body := p.DoAs(p.UserToken, "POST", "/api/conversations/"+conv+"/permissions/req-none", "application/json", `{"behavior":"allow"}`)
	id := body.Error.RequestID
	if code != 404 || !strings.HasPrefix(id, "req_") {
		t.Fatalf("answer %d %+v, want 404 with a request id", code, body)
	}
	cp, w := cpLog.lines(`"request_id":"`+id+`"`), wLog.lines(`"request_id":"`+id+`"`)
	if len(cp) == 0 || len(w) == 0 {
		t.Fatalf("request %s: control plane lines %q, worker lines %q", id, cp, w)
	}
	if !strings.Contains(strings.Join(w, "\n"), "permission request not found") {
		t.Errorf("the worker's lines do not say what failed: %q", w)
	}
}

// TestFailedTurnNamesTheModelCall: a turn that fails because the gateway
// refused its model call (the budget) shows the browser the call's request
// id in the turn_failed message, and that id finds the call's lines in the
// worker's log (its local proxy) and in the control plane's (the mint and
// the gateway).
func TestFailedTurnNamesTheModelCall(t *testing.T) {
	var cpLog, wLog syncBuffer
	p := platformtest.Start(t, platformtest.Options{
		ControlPlane: func(c *controlplane.Config) { c.Logger = slog.New(slog.NewJSONHandler(&cpLog, nil)) },
		Worker:       func(c *worker.Config) { c.Logger = slog.New(slog.NewJSONHandler(&wLog, nil)) },
	})
	setLimit(t, p, "dev", 1_000) // below any call's worst case
	conv := p.NewConversation()
	s := p.OpenStream(conv, 0)
	p.Send(conv, "hello")
	end := s.Until(5*time.Minute, platformtest.TurnEnd)
	if end.Type != contract.EventTurnFailed {
		t.Fatalf("got %s %s, want turn_failed", end.Type, end.Data)
	}
	f := platformtest.Payload[contract.TurnFailed](t, end)
	id := regexp.MustCompile(`req_[a-z2-7]{20}`).FindString(f.Message)
	if id == "" {
		t.Fatalf("turn_failed message names no request id: %q", f.Message)
	}
	cp, w := cpLog.lines(`"request_id":"`+id+`"`), wLog.lines(`"request_id":"`+id+`"`)
	refused := false
	for _, l := range cp {
		refused = refused || (strings.Contains(l, `"msg":"gateway refused call"`) && strings.Contains(l, `"reason":"budget"`) &&
			strings.Contains(l, "budget exceeded")) // the cause, in the log only
	}
	if !refused || !strings.Contains(strings.Join(w, "\n"), `"status":429`) {
		t.Fatalf("request %s: control plane lines %q, worker lines %q", id, cp, w)
	}
}
