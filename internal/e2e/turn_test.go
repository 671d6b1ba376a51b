package e2e

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
)

// gatewayRecorder keeps the X-Worker-Token of every call to the gateway.
type gatewayRecorder struct {
	mu     sync.Mutex
	tokens []string
}

func (g *gatewayRecorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, contract.PathGatewayPrefix) {
			g.mu.Lock()
			g.tokens = append(g.tokens, r.Header.Get(contract.HeaderWorkerToken))
			g.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

// TestTurnThroughTheWholeChain runs two turns with the real CLI through
// browser API → control plane → worker → CLI → local proxy → mint →
// gateway-proxy → upstream and back, then a third after the CLI process was
// stopped, and checks what every hop saw.
func TestTurnThroughTheWholeChain(t *testing.T) {
	// Secrets in the worker's own environment that must never reach the CLI.
	t.Setenv("ANTHROPIC_API_KEY", "sk-ant-must-not-leak")
	t.Setenv("TALKIDE_WORKER_IDENTITY_TOKEN", "identity-must-not-leak")
	rec := &gatewayRecorder{}
	p := platformtest.Start(t, platformtest.Options{Wrap: rec.wrap})
	conv := p.NewConversation()
	stream := p.OpenStream(conv, 0)

	// Turn 1: a Bash command in the conversation's working directory.
	msg1 := p.Send(conv, "please run `echo hello-from-talkide && pwd && env`")
	end := stream.Until(60*time.Second, platformtest.TurnEnd)
	if end.Type != contract.EventTurnCompleted {
		t.Fatalf("turn 1 ended with %s: %s", end.Type, end.Data)
	}
	var lastID int64
	var sawUse, sawResult bool
	var result contract.ToolResult
	var finalText string
	for _, ev := range stream.Events {
		if ev.ID != lastID+1 {
			t.Errorf("event ids not consecutive: %d after %d", ev.ID, lastID)
		}
		lastID = ev.ID
		switch ev.Type {
		case contract.EventToolUse:
			u := platformtest.Payload[contract.ToolUse](t, ev)
			sawUse = u.Name == "Bash" && strings.Contains(string(u.Input), "echo hello-from-talkide")
		case contract.EventToolResult:
			result = platformtest.Payload[contract.ToolResult](t, ev)
			sawResult = true
		case contract.EventAssistantText:
			finalText = platformtest.Payload[contract.AssistantText](t, ev).Text
		}
	}
	if !sawUse || !sawResult {
		t.Fatalf("tool use %v, tool result %v; events: %s", sawUse, sawResult, platformtest.Summary(stream.Events))
	}
	if done := platformtest.Payload[contract.TurnCompleted](t, end); done.ClientMessageID != msg1 || done.Usage.InputTokens == 0 {
		t.Errorf("turn_completed: got %+v, want message %s and usage", done, msg1)
	}
	if !strings.Contains(result.Content, "hello-from-talkide") {
		t.Errorf("tool result does not hold the output: %q", result.Content)
	}
	if !strings.Contains(finalText, "hello-from-talkide") {
		t.Errorf("final assistant text does not quote the output: %q", finalText)
	}
	var status struct {
		Worker contract.SessionStatus `json:"worker"`
	}
	p.Do("GET", "/api/conversations/"+conv, nil, &status)
	if !strings.Contains(result.Content, status.Worker.WorkDir) || status.Worker.WorkDir == "" {
		t.Errorf("command did not run in the conversation's working directory %q: %q", status.Worker.WorkDir, result.Content)
	}
	// The CLI's environment (inherited by its Bash tool): the local proxy as
	// base URL, no API key, none of the worker's secrets.
	for _, leak := range []string{"ANTHROPIC_API_KEY", "sk-ant-must-not-leak", "identity-must-not-leak", "TALKIDE_", platformtest.UpstreamAPIKey} {
		if strings.Contains(result.Content, leak) {
			t.Errorf("CLI environment holds %q", leak)
		}
	}
	if !strings.Contains(result.Content, "ANTHROPIC_BASE_URL=http://127.0.0.1:") || !strings.Contains(result.Content, "/"+conv) {
		t.Errorf("CLI environment lacks the local proxy base URL with the conversation prefix")
	}

	// What the gateway saw: valid WorkerTokens scoped to this conversation.
	v := token.NewVerifier(token.PurposeGateway, p.Master.Derive(token.PurposeGateway, "", ""))
	rec.mu.Lock()
	tokens := append([]string(nil), rec.tokens...)
	rec.mu.Unlock()
	if len(tokens) < 2 {
		t.Fatalf("gateway saw %d calls, want at least 2", len(tokens))
	}
	seen := map[string]bool{}
	for _, tok := range tokens {
		c, err := v.Verify(tok)
		if err != nil {
			t.Fatalf("gateway got an invalid WorkerToken: %v", err)
		}
		if c.Conversation != conv || c.Tenant != "demo" || c.Env != "dev" || c.User != "dev" {
			t.Errorf("WorkerToken claims: got %+v", c)
		}
		if seen[c.ID] {
			t.Errorf("WorkerToken %s reused: want a fresh one per call", c.ID)
		}
		seen[c.ID] = true
	}
	// What the upstream saw: only the API key.
	reqs := p.Upstream.Requests()
	sessionIDs := map[string]bool{}
	for _, r := range reqs {
		if r.Path != "/v1/messages" {
			continue
		}
		if got := r.Header.Get("X-Api-Key"); got != platformtest.UpstreamAPIKey {
			t.Errorf("upstream x-api-key: got %q", got)
		}
		for _, h := range []string{"Authorization", contract.HeaderWorkerToken, "Cookie"} {
			if r.Header.Get(h) != "" {
				t.Errorf("upstream saw %s: %q", h, r.Header.Get(h))
			}
		}
		for k, vs := range r.Header {
			for _, val := range vs {
				if strings.Contains(val, "talkide-local-") || strings.Count(val, ".") == 2 && len(val) > 100 {
					t.Errorf("upstream saw a placeholder or token in %s", k)
				}
			}
		}
		if r.Header.Get("Anthropic-Version") == "" || r.Header.Get("Anthropic-Beta") == "" {
			t.Errorf("anthropic-* headers not forwarded: %v", r.Header)
		}
		sessionIDs[r.Header.Get("X-Claude-Code-Session-Id")] = true
	}

	// Turn 2 continues the same CLI session (same process, same id).
	p.Send(conv, "and now run `echo second-turn`")
	end = stream.Until(60*time.Second, platformtest.TurnEnd)
	if end.Type != contract.EventTurnCompleted {
		t.Fatalf("turn 2 ended with %s: %s", end.Type, end.Data)
	}
	starts := 0
	for _, ev := range stream.Events {
		if ev.Type == contract.EventSessionStarted {
			starts++
		}
	}
	if starts != 1 {
		t.Errorf("session_started %d times over two turns, want 1 (one CLI process)", starts)
	}
	for _, r := range p.Upstream.Requests()[len(reqs):] {
		if r.Path == "/v1/messages" {
			sessionIDs[r.Header.Get("X-Claude-Code-Session-Id")] = true
		}
	}
	if len(sessionIDs) != 1 || !sessionIDs[status.Worker.SessionID] {
		t.Errorf("CLI session ids seen upstream: %v, want only %s", sessionIDs, status.Worker.SessionID)
	}

	// Turn 3 after the process is gone: resumed from the transcript, with history.
	st, err := p.WorkerClient().Stop(t.Context(), conv)
	if err != nil || st.ProcessRunning {
		t.Fatalf("stop: %v, process running %v", err, st.ProcessRunning)
	}
	before := len(p.Upstream.Requests())
	p.Send(conv, "what was the first command? just say it")
	end = stream.Until(60*time.Second, platformtest.TurnEnd)
	if end.Type != contract.EventTurnCompleted {
		t.Fatalf("turn 3 ended with %s: %s", end.Type, end.Data)
	}
	var resumed *contract.SessionStarted
	for _, ev := range stream.Events {
		if ev.Type == contract.EventSessionStarted {
			s := platformtest.Payload[contract.SessionStarted](t, ev)
			resumed = &s
		}
	}
	if resumed == nil || !resumed.Resumed || resumed.SessionID != status.Worker.SessionID {
		t.Errorf("third turn: session_started %+v, want resumed %s", resumed, status.Worker.SessionID)
	}
	var history bool
	for _, r := range p.Upstream.Requests()[before:] {
		if r.Path == "/v1/messages" && strings.Contains(string(r.Body), "hello-from-talkide") {
			history = true
		}
	}
	if !history {
		t.Error("resumed session did not send the earlier history upstream")
	}
}
