package localproxy_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/gateway"
	"github.com/talkide/talkide/internal/controlplane/mint"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker/localproxy"
)

// TestLocalProxyThroughRealControlPlane runs the whole seam on loopback: the
// local proxy mints with a real identity token at the real mint, the real
// gateway checks the WorkerToken and the budget and calls the development
// upstream with the API key. Only the control plane's key reaches the
// upstream, and the call is booked for the conversation's user.
func TestLocalProxyThroughRealControlPlane(t *testing.T) {
	ctx := t.Context()
	db, err := controlstore.OpenSQLite(ctx, filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.UpsertUser(ctx, controlstore.User{ID: "alice", TokenHash: "h"}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, c := range []controlstore.Conversation{
		{ID: convA, Tenant: "demo", Env: "dev", UserID: "alice", CreatedAt: now},
		{ID: convB, Tenant: "other", Env: "dev", UserID: "alice", CreatedAt: now},
	} {
		if err := db.CreateConversation(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	master, err := token.NewMasterKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	m := mint.New(db, master, log)
	identityToken, err := m.IssueIdentity(ctx, "demo", "dev", 0)
	if err != nil {
		t.Fatal(err)
	}

	up := devupstream.New(devupstream.Config{APIKey: "sk-up"})
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	upURL, _ := url.Parse(upSrv.URL)
	svc := budget.NewService(db, budget.Config{})
	gw := gateway.New(gateway.Config{
		Upstream: upURL, APIKey: "sk-up", Budget: svc, Logger: log,
		Keys: []token.Key{master.Derive(token.PurposeGateway, "", "")},
	})
	mux := http.NewServeMux() // mounted as the control plane mounts them
	mux.Handle("POST "+contract.PathMint, m)
	mux.Handle(contract.PathGatewayPrefix+"/", gw)
	cp := httptest.NewServer(mux)
	t.Cleanup(cp.Close)
	cpURL, _ := url.Parse(cp.URL)

	s, _ := startProxy(t, &localproxy.MintingGatewayProxy{
		Gateway: cpURL,
		Mint:    &localproxy.MintClient{Base: cpURL, Identity: fixedIdentity(t, identityToken)},
	})
	secretA, secretB := localproxy.NewPlaceholderSecret(), localproxy.NewPlaceholderSecret()
	s.Register(convA, secretA)
	s.Register(convB, secretB)

	up.Script(devupstream.Response{
		Content: []devupstream.ContentBlock{devupstream.Text("hello through the chain")},
		Usage:   &devupstream.Usage{InputTokens: 100, OutputTokens: 20},
	})
	hdr := bearer(secretA)
	hdr.Set("Anthropic-Version", "2023-06-01")
	got := send(t, http.MethodPost, s.BaseURL(convA)+"/v1/messages?beta=true", hdr, messagesBody)
	if got.status != http.StatusOK || !strings.Contains(string(got.body), `"text":"throug"`) || !strings.HasSuffix(string(got.body), "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") {
		t.Fatalf("got %d %q, want 200 with the upstream's answer", got.status, got.body)
	}
	recs := up.Requests()
	if len(recs) != 1 {
		t.Fatalf("upstream requests: got %d, want 1", len(recs))
	}
	if diff := cmp.Diff([]string{"sk-up"}, recs[0].Header.Values("X-Api-Key")); diff != "" {
		t.Errorf("upstream x-api-key (-want +got):\n%s", diff)
	}
	for _, k := range []string{"Authorization", contract.HeaderWorkerToken, "Cookie"} {
		if v := recs[0].Header.Values(k); len(v) != 0 {
			t.Errorf("upstream header %s: got %q, want none", k, v)
		}
	}
	if recs[0].Path != "/v1/messages" || recs[0].Query != "beta=true" {
		t.Errorf("upstream URL: got %s?%s, want /v1/messages?beta=true", recs[0].Path, recs[0].Query)
	}
	want := func() budget.NanoUSD {
		p, _ := budget.DefaultPrices().PriceFor("claude-sonnet-4-5-20250929", time.Now())
		return p.Cost(anthropic.Usage{InputTokens: 100, OutputTokens: 20})
	}()
	deadline := time.Now().Add(2 * time.Second)
	for {
		sp, err := svc.Spend(ctx, "alice", "demo")
		if err != nil {
			t.Fatal(err)
		}
		if sp.Spent == want && sp.Reserved == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("spend of alice: got spent %d reserved %d, want spent %d reserved 0", sp.Spent, sp.Reserved, want)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The worker of demo/dev cannot spend for another tenant's
	// conversation, even when its local proxy has a placeholder for it.
	checkEnvelope(t, send(t, http.MethodPost, s.BaseURL(convB)+"/v1/messages", bearer(secretB), messagesBody), http.StatusForbidden, anthropic.ErrPermission)
	if n := len(up.Requests()); n != 1 {
		t.Errorf("upstream requests after the refused call: got %d, want still 1", n)
	}
}
