package gateway_test

import (
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/httpapi"
)

// A model call the control plane's open-files budget has no socket for
// (issue 28: the budget is shared by browser streams, feeds and model
// calls) is this process's refusal, not the upstream's failure: 529
// overloaded_error with Retry-After, which Claude Code retries, and
// nothing is booked. Before, a dial failing with EMFILE was answered 502
// "upstream unreachable" with x-should-retry false, ending the turn.
func TestModelCallWithoutAFileIsRefusedAsOverloaded(t *testing.T) {
	up := httptest.NewServer(devupstream.New(devupstream.Config{APIKey: "sk-test"}))
	t.Cleanup(up.Close)
	files := httpapi.NewFiles(0) // spent
	_, srv, master, svc := gatewayWith(t, up.URL, slog.New(slog.DiscardHandler), files.DialContext(&net.Dialer{Timeout: time.Second}))

	resp, body := postMessages(t, srv, master)
	var env anthropic.ErrorEnvelope
	if err := json.Unmarshal(body, &env); err != nil || resp.StatusCode != 529 || env.Error.Type != anthropic.ErrOverloaded {
		t.Fatalf("got %d %s, want 529 overloaded_error", resp.StatusCode, body)
	}
	if resp.Header.Get("Retry-After") == "" || resp.Header.Get("x-should-retry") == "false" {
		t.Errorf("headers %v: want Retry-After and no x-should-retry: false", resp.Header)
	}
	var spend budget.Spend
	waitFor(t, "the reservation released", func() bool {
		var err error
		spend, err = svc.Spend(t.Context(), "alice", "acme")
		return err == nil && spend.Reserved == 0
	})
	if spend.Spent != 0 {
		t.Errorf("spend %+v: a call never sent must book nothing", spend)
	}

	// With a file, the same call goes through.
	files.SetMax(8)
	if resp, body := postMessages(t, srv, master); resp.StatusCode != http.StatusOK {
		t.Fatalf("with room: %d %s", resp.StatusCode, body)
	}
	if files.Open() == 0 {
		t.Error("the upstream connection was not counted in the budget")
	}
}
