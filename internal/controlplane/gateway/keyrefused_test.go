package gateway_test

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/gateway"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/platformtest"
)

// TestRefusedAPIKeyIsNamedAtOnce guards the first stumble of issue 29:
// with an API key the upstream refuses (401 authentication_error), the
// CLI read the 401 as its own login, retried ten times and failed after
// three minutes with "Not logged in · Please run /login", and the
// upstream's reason was nowhere. The key the upstream refuses is the
// control plane's, so the gateway answers 502 api_error with
// x-should-retry: false and a message that says so with the upstream's
// reason; nothing is booked; the log has it at ERROR; and CheckUpstream
// (the start-up check and /healthz) names it before any call is made.
func TestRefusedAPIKeyIsNamedAtOnce(t *testing.T) {
	up := httptest.NewServer(devupstream.New(devupstream.Config{APIKey: "sk-the-right-key"}))
	t.Cleanup(up.Close)
	logs := &platformtest.LogBuffer{}
	gw, srv, master, svc := gatewayWith(t, up.URL, slog.New(slog.NewJSONHandler(logs, nil)), nil) // its key is sk-test

	err := gw.CheckUpstream(t.Context())
	var ue *gateway.UpstreamError
	if !errors.As(err, &ue) || !ue.KeyRefused || !strings.Contains(err.Error(), "refused this platform's API key (401 authentication_error: invalid API key)") {
		t.Fatalf("CheckUpstream before any call: got %v, want a key-refused *UpstreamError quoting the upstream", err)
	}

	resp, body := postMessages(t, srv, master)
	var env anthropic.ErrorEnvelope
	if err := json.Unmarshal(body, &env); err != nil || resp.StatusCode != http.StatusBadGateway || env.Error.Type != anthropic.ErrAPI {
		t.Fatalf("got %d %s, want 502 api_error in Anthropic's envelope", resp.StatusCode, body)
	}
	for _, want := range []string{"model upstream " + up.URL + " refused this platform's API key", "invalid API key", "ANTHROPIC_API_KEY", env.RequestID} {
		if !strings.Contains(env.Error.Message, want) {
			t.Errorf("message %q does not say %q", env.Error.Message, want)
		}
	}
	if got := resp.Header.Get("x-should-retry"); got != "false" {
		t.Errorf("x-should-retry: got %q, want false (the same key is refused again)", got)
	}
	if resp.Header.Get("Www-Authenticate") != "" || strings.Contains(string(body), "authentication_error\"") || strings.Contains(strings.ToLower(string(body)), "x-api-key") {
		t.Errorf("the answer still reads as the caller's own authentication failure: %v %s", resp.Header, body)
	}
	var spend budget.Spend
	waitFor(t, "the reservation released", func() bool {
		var err error
		spend, err = svc.Spend(t.Context(), "alice", "acme")
		return err == nil && spend.Reserved == 0
	})
	if spend.Spent != 0 {
		t.Errorf("spend %+v: a refused call must book nothing", spend)
	}
	var line struct{ Level, Msg, Cause string }
	for _, l := range strings.Split(logs.String(), "\n") {
		if json.Unmarshal([]byte(l), &line) == nil && line.Msg == "model upstream refused the API key" {
			break
		}
		line.Msg = ""
	}
	if line.Level != "ERROR" || !strings.Contains(line.Cause, "invalid API key") {
		t.Errorf("log line: %+v, want ERROR \"model upstream refused the API key\" with the cause\n%s", line, logs)
	}
	if strings.Contains(logs.String(), "sk-test") {
		t.Error("the log holds the API key")
	}
}

// TestAcceptedKeyChecksOut: an upstream that takes the key, or has no
// /v1/models to ask (a proxy: 404), passes the check.
func TestAcceptedKeyChecksOut(t *testing.T) {
	up := httptest.NewServer(devupstream.New(devupstream.Config{APIKey: "sk-test"}))
	t.Cleanup(up.Close)
	gw, _, _ := gatewayTo(t, up.URL)
	if err := gw.CheckUpstream(t.Context()); err != nil {
		t.Errorf("CheckUpstream with the upstream's key: %v", err)
	}
	proxy := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(proxy.Close)
	gw, _, _ = gatewayTo(t, proxy.URL)
	if err := gw.CheckUpstream(t.Context()); err != nil {
		t.Errorf("CheckUpstream of an upstream without /v1/models: %v", err)
	}
}
