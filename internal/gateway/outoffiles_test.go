package gateway_test

import (
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/budget"
	"github.com/talkide/talkide/internal/controlstore"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/gateway"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/token"
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
	u, _ := url.Parse(up.URL)
	db, err := controlstore.OpenSQLite(t.Context(), filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	master, err := token.NewMasterKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	files := httpapi.NewFiles(0) // spent
	svc := budget.NewService(db, budget.Config{})
	gw := gateway.New(gateway.Config{Upstream: u, APIKey: "sk-test", Keys: []token.Key{master.Derive(token.PurposeGateway, "", "")},
		Budget: svc, Logger: slog.New(slog.DiscardHandler), Dial: files.DialContext(&net.Dialer{Timeout: time.Second})})
	srv := httptest.NewServer(gw)
	t.Cleanup(func() { srv.Close(); gw.Close(); svc.Close(); db.Close() })

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
