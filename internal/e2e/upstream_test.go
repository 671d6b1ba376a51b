package e2e

import (
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

// TestUnreachableUpstreamEndsTheTurnAtOnce guards F2 (cases/first-run.md)
// with the real CLI: a model upstream that refuses connections made the
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
