package e2e

import (
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/platformtest"
)

// TestUnreachableUpstreamEndsTheTurnAtOnce guards a first-run fault found
// from outside, with the real CLI: a model upstream that refuses connections made the
// turn retry ten times over three minutes and fail with a message naming
// the worker's internal proxy port. The gateway's 502 names the upstream
// and the cause with x-should-retry: false, so the turn fails after one
// call with that reason.
func TestUnreachableUpstreamEndsTheTurnAtOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead, _ := url.Parse("http://" + ln.Addr().String())
	ln.Close()
	calls := &gatewayCalls{}
	p := platformtest.Start(t, platformtest.Options{Wrap: calls.wrap, ControlPlane: func(c *controlplane.Config) { c.Upstream = dead }})
	conv := p.NewConversation()
	s := p.OpenStream(conv, 0)
	start := time.Now()
	p.Send(conv, "hello")
	end := s.Until(5*time.Minute, platformtest.TurnEnd)
	t.Logf("the turn ended after %s; gateway answers: %v", time.Since(start).Round(time.Millisecond), calls.seen())
	if end.Type != contract.EventTurnFailed {
		t.Fatalf("got %s %s, want turn_failed", end.Type, end.Data)
	}
	f := platformtest.Payload[contract.TurnFailed](t, end)
	t.Logf("turn_failed: %s", f.Message)
	for _, want := range []string{"model upstream " + dead.String(), "connection to " + dead.Host + " refused"} {
		if !strings.Contains(f.Message, want) {
			t.Errorf("turn_failed message %q does not say %q", f.Message, want)
		}
	}
	if got := calls.seen(); len(got) != 1 || got[0] != http.StatusBadGateway {
		t.Errorf("gateway calls: got %v, want exactly one, answered 502 (retrying cannot reach the upstream either)", got)
	}
}

// TestRefusedAPIKeyEndsTheTurnAtOnce guards the first stumble of issue 29
// with the real CLI: with an API key the upstream refuses, the turn failed
// after ten retries and three minutes with "Not logged in · Please run
// /login", and the upstream's reason was nowhere. Now the turn fails after
// one call with a message that names the refused key and the upstream's
// reason, and /healthz says the same before any turn.
func TestRefusedAPIKeyEndsTheTurnAtOnce(t *testing.T) {
	calls := &gatewayCalls{}
	p := platformtest.Start(t, platformtest.Options{Wrap: calls.wrap, ControlPlane: func(c *controlplane.Config) { c.APIKey = "sk-ant-not-this-one" }})
	resp, err := http.Get(p.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	health, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(health), "refused this platform's API key (401 authentication_error: invalid API key)") {
		t.Errorf("/healthz: got %d %s, want 503 naming the refused key", resp.StatusCode, health)
	}

	conv := p.NewConversation()
	s := p.OpenStream(conv, 0)
	start := time.Now()
	p.Send(conv, "hello")
	end := s.Until(5*time.Minute, platformtest.TurnEnd)
	t.Logf("the turn ended after %s; gateway answers: %v", time.Since(start).Round(time.Millisecond), calls.seen())
	if end.Type != contract.EventTurnFailed {
		t.Fatalf("got %s %s, want turn_failed", end.Type, end.Data)
	}
	f := platformtest.Payload[contract.TurnFailed](t, end)
	t.Logf("turn_failed: %s", f.Message)
	for _, want := range []string{"refused this platform's API key", "invalid API key", "ANTHROPIC_API_KEY"} {
		if !strings.Contains(f.Message, want) {
			t.Errorf("turn_failed message %q does not say %q", f.Message, want)
		}
	}
	if strings.Contains(f.Message, "/login") {
		t.Errorf("turn_failed message %q tells the user to log in", f.Message)
	}
	if got := calls.seen(); len(got) != 1 || got[0] != http.StatusBadGateway {
		t.Errorf("gateway calls: got %v, want exactly one, answered 502 (the same key is refused again)", got)
	}
}
