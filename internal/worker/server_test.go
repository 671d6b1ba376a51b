package worker_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/workerclient"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker"
	"github.com/talkide/talkide/internal/worker/harness"
	"github.com/talkide/talkide/internal/worker/localproxy"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

type fixture struct {
	srv    *httptest.Server
	master token.MasterKey
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	store, err := sessionstore.Open(dir + "/talkide")
	if err != nil {
		t.Fatal(err)
	}
	up, _ := url.Parse("http://127.0.0.1:1")
	local := localproxy.NewServer(&localproxy.NoOpGatewayProxy{Upstream: up}, slog.New(slog.DiscardHandler))
	ln, err := local.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	h, err := harness.New(harness.Config{
		ClaudeBin: platformtest.ClaudeBin(t), ConfigDir: dir + "/cfg", WorkspaceRoot: dir + "/ws", HomeDir: dir + "/home",
	}, store, local)
	if err != nil {
		t.Fatal(err)
	}
	master, _ := token.NewMasterKey("k1")
	api := worker.NewServer(h, "acme", "dev", []token.Key{master.Derive(token.PurposeWorkerRequest, "acme", "dev")}, slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return &fixture{srv: srv, master: master}
}

func (f *fixture) sign(t *testing.T, k token.Key, tenant, env, method, path string, body []byte) string {
	t.Helper()
	tok, err := token.NewSigner(token.PurposeWorkerRequest, k).Sign(token.RequestClaims(tenant, env, method, path, body), token.RequestTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (f *fixture) do(t *testing.T, method, path string, body []byte, tok string) (int, contract.ErrorBody) {
	t.Helper()
	req, _ := http.NewRequest(method, f.srv.URL+path, bytes.NewReader(body))
	if tok != "" {
		req.Header.Set(contract.HeaderWorkerToken, tok)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var eb contract.ErrorBody
	_ = json.Unmarshal(b, &eb)
	return resp.StatusCode, eb
}

// TestRequestTokenAttacks sends requests that a network attacker, another
// tenant's worker, or a holder of some other token could forge.
func TestRequestTokenAttacks(t *testing.T) {
	f := newFixture(t)
	own := f.master.Derive(token.PurposeWorkerRequest, "acme", "dev")
	other := f.master.Derive(token.PurposeWorkerRequest, "globex", "dev")
	path := "/v1/conversations/c1/session"
	body := []byte(`{"user_id":"u1"}`)
	gatewayTok, _ := token.NewSigner(token.PurposeGateway, f.master.Derive(token.PurposeGateway, "", "")).Sign(token.Claims{Tenant: "acme", Env: "dev"}, time.Minute)
	cases := []struct {
		name string
		tok  string
		body []byte
	}{
		{"no token", "", body},
		{"garbage", "x.y.z", body},
		{"other tenant's key", f.sign(t, other, "acme", "dev", "POST", path, body), body},
		{"other tenant's token", f.sign(t, other, "globex", "dev", "POST", path, body), body},
		{"WorkerToken instead of request token", gatewayTok, body},
		{"signed for another path", f.sign(t, own, "acme", "dev", "POST", "/v1/conversations/c2/session", body), body},
		{"signed for another method", f.sign(t, own, "acme", "dev", "GET", path, body), body},
		{"signed for another body", f.sign(t, own, "acme", "dev", "POST", path, []byte(`{"user_id":"evil"}`)), body},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, eb := f.do(t, "POST", path, tc.body, tc.tok)
			if st != http.StatusUnauthorized || eb.Error.Type != contract.ErrTypeUnauthorized {
				t.Errorf("got %d %+v, want 401 unauthorized", st, eb)
			}
		})
	}
	// The genuine request works once; its replay is refused.
	tok := f.sign(t, own, "acme", "dev", "POST", path, body)
	if st, eb := f.do(t, "POST", path, body, tok); st != http.StatusOK {
		t.Fatalf("genuine request: got %d %+v", st, eb)
	}
	if st, _ := f.do(t, "POST", path, body, tok); st != http.StatusUnauthorized {
		t.Errorf("replayed request: got %d, want 401", st)
	}
}

func TestAPIErrors(t *testing.T) {
	f := newFixture(t)
	u, _ := url.Parse(f.srv.URL)
	c := workerclient.New(u, "acme", "dev", f.master.Derive(token.PurposeWorkerRequest, "acme", "dev"))
	ctx := t.Context()
	var we *workerclient.Error
	if _, err := c.Status(ctx, "missing"); !asErr(err, &we) || we.Status != 404 || we.Type != contract.ErrTypeNotFound {
		t.Errorf("status of unknown conversation: got %v, want 404 not_found", err)
	}
	if _, err := c.CreateSession(ctx, "c1", contract.CreateSessionRequest{UserID: "u1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSession(ctx, "c1", contract.CreateSessionRequest{UserID: "u2"}); !asErr(err, &we) || we.Status != 403 {
		t.Errorf("another user's session: got %v, want 403", err)
	}
	if _, err := c.SendMessage(ctx, "c1", contract.SendMessageRequest{ClientMessageID: "m1", UserID: "u2", Text: "hi"}); !asErr(err, &we) || we.Status != 403 {
		t.Errorf("message as another user: got %v, want 403", err)
	}
	for name, req := range map[string]contract.SendMessageRequest{
		"empty text":        {ClientMessageID: "m1", UserID: "u1"},
		"bad message id":    {ClientMessageID: "../x", UserID: "u1", Text: "hi"},
		"oversized message": {ClientMessageID: "m1", UserID: "u1", Text: strings.Repeat("x", contract.MaxMessageBytes+1)},
	} {
		if _, err := c.SendMessage(ctx, "c1", req); !asErr(err, &we) || (we.Status != 400 && we.Status != 413) {
			t.Errorf("%s: got %v, want 400 or 413", name, err)
		}
	}
	if _, err := c.Status(ctx, "bad..id"); !asErr(err, &we) || we.Status != 400 {
		t.Errorf("invalid conversation id: got %v, want 400", err)
	}
	resp, err := http.Get(f.srv.URL + "/readyz")
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("readyz: %v %v", resp, err)
	}
}

func asErr(err error, target **workerclient.Error) bool {
	e, ok := err.(*workerclient.Error)
	if ok {
		*target = e
	}
	return ok
}

func TestConfigValidate(t *testing.T) {
	master, _ := token.NewMasterKey("k1")
	idOther, _ := token.NewSigner(token.PurposeIdentity, master.Derive(token.PurposeIdentity, "", "")).Sign(token.Claims{Tenant: "globex", Env: "dev"}, time.Hour)
	gw, _ := url.Parse("http://cp")
	c := worker.Config{Tenant: "acme", Env: "dev", RequestKeys: []token.Key{{ID: "k"}}, GatewayBaseURL: gw, IdentityToken: idOther, ClaudeBin: "/bin/true"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "bound to globex/dev") {
		t.Errorf("identity token of another tenant-env: got %v", err)
	}
	if err := (&worker.Config{ClaudeBin: "/bin/true"}).Validate(); err == nil || !strings.Contains(err.Error(), "TALKIDE_TENANT") {
		t.Errorf("empty config: got %v", err)
	}
}
