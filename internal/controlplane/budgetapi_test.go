package controlplane

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/pgtest"
	"github.com/talkide/talkide/internal/token"
)

const adminToken = "admin-token-0123456789abcdef"

type cpFixture struct {
	url    string
	master token.MasterKey
	db     *controlstore.DB
	s      *Server
}

// startControlPlane assembles the control plane as Run does, on SQLite or
// (databaseURL set) PostgreSQL, with a development upstream.
func startControlPlane(t *testing.T, databaseURL string, admin string) *cpFixture {
	t.Helper()
	return startControlPlaneWith(t, func(c *Config) { c.DatabaseURL, c.AdminToken = databaseURL, admin })
}

// testConfig is a control plane's configuration on SQLite in a temporary
// directory with a development upstream, changed by set before it is
// validated, and its database opened (closed by the caller).
func testConfig(t *testing.T, set func(*Config)) (Config, *controlstore.DB) {
	t.Helper()
	master, err := token.NewMasterKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(devupstream.New(devupstream.Config{APIKey: "sk-up"}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	cfg := Config{DBPath: filepath.Join(t.TempDir(), "cp.db"),
		MasterKeys: []token.MasterKey{master}, Upstream: upURL, APIKey: "sk-up", Logger: slog.New(slog.DiscardHandler)}
	set(&cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	db, err := OpenDB(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, db
}

// startControlPlaneWith is startControlPlane on SQLite with the Config
// changed by set before it is validated.
func startControlPlaneWith(t *testing.T, set func(*Config)) *cpFixture {
	t.Helper()
	cfg, db := testConfig(t, set)
	master := cfg.MasterKeys[0]
	spend := newSpendParts(cfg, db)
	s, _ := NewServer(cfg, db, spend)
	srv := httptest.NewServer(s)
	// BeginShutdown ends the browser streams taken over from srv (which
	// its Close does not wait for) and their feeds.
	t.Cleanup(func() { s.BeginShutdown(); srv.Close(); spend.close(); db.Close() })
	return &cpFixture{url: srv.URL, master: master, db: db, s: s}
}

func (f *cpFixture) do(t *testing.T, method, path, auth, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, f.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// modelCall makes one gateway call for user through the control plane.
func (f *cpFixture) modelCall(t *testing.T, user string) int {
	t.Helper()
	return f.modelCallIn(t, user, "conv-1")
}

// modelCallIn makes one gateway call for user in conversation conv.
func (f *cpFixture) modelCallIn(t *testing.T, user, conv string) int {
	t.Helper()
	tok, err := token.NewSigner(token.PurposeGateway, f.master.Derive(token.PurposeGateway, "", "")).
		Sign(token.Claims{Tenant: "acme", Env: "dev", Conversation: conv, User: user}, token.WorkerTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, f.url+contract.PathGatewayPrefix+"/v1/messages",
		strings.NewReader(`{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set(contract.HeaderWorkerToken, tok)
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestBudgetAdminAPI(t *testing.T) {
	for name, dbURL := range map[string]func(t *testing.T) string{
		"sqlite":   func(*testing.T) string { return "" },
		"postgres": func(t *testing.T) string { return pgtest.SchemaURL(t) },
	} {
		t.Run(name, func(t *testing.T) {
			f := startControlPlane(t, dbURL(t), adminToken)
			for _, tc := range []struct {
				auth string
				want int
			}{{"", 401}, {"wrong-token-0123456789", 401}, {adminToken, 200}} {
				if st, b := f.do(t, "GET", "/api/admin/budget/users/alice", tc.auth, ""); st != tc.want {
					t.Errorf("auth %q: got %d %s, want %d", tc.auth, st, b, tc.want)
				}
			}
			// Tenant default, then a user override, in dollars and nano-USD.
			if st, b := f.do(t, "PUT", "/api/admin/budget/tenants/acme/limit", adminToken, `{"limit_usd":"5"}`); st != 200 {
				t.Fatalf("set tenant limit: %d %s", st, b)
			}
			var sp spendJSON
			_, b := f.do(t, "GET", "/api/admin/budget/users/alice?tenant=acme", adminToken, "")
			if json.Unmarshal(b, &sp); sp.LimitUSD != "5" || sp.LimitSource != "tenant" {
				t.Errorf("tenant default: got %s", b)
			}
			st, b := f.do(t, "PUT", "/api/admin/budget/users/alice/limit", adminToken, `{"limit_usd":"12.345"}`)
			if json.Unmarshal(b, &sp); st != 200 || sp.LimitNanoUSD != 12_345_000_000 || sp.LimitSource != "user" || sp.RemainingUSD != "12.345" {
				t.Errorf("set user limit: got %d %s", st, b)
			}
			for _, bad := range []string{`{"limit_usd":"-1"}`, `{"limit_usd":"1e3"}`, `{"limit_usd":"1","limit_nano_usd":5}`, `{}`, `{"limit":1}`, `not json`} {
				if st, b := f.do(t, "PUT", "/api/admin/budget/users/alice/limit", adminToken, bad); st != 400 {
					t.Errorf("limit %s: got %d %s, want 400", bad, st, b)
				}
			}
			// A call is booked and visible in the spend and the ledger.
			if st := f.modelCall(t, "alice"); st != 200 {
				t.Fatalf("model call: %d", st)
			}
			var ledger struct{ Entries []budget.LedgerEntry }
			deadline := 100
			for ; deadline > 0; deadline-- {
				_, b = f.do(t, "GET", "/api/admin/budget/ledger?user=alice&kind=debit", adminToken, "")
				json.Unmarshal(b, &ledger)
				if len(ledger.Entries) == 1 {
					break
				}
				waitABit()
			}
			if len(ledger.Entries) != 1 || ledger.Entries[0].Amount <= 0 || ledger.Entries[0].Outcome != "complete" || ledger.Entries[0].Tenant != "acme" {
				t.Fatalf("ledger: got %s, want one complete debit", b)
			}
			_, b = f.do(t, "GET", "/api/admin/budget/users/alice?tenant=acme", adminToken, "")
			if json.Unmarshal(b, &sp); sp.SpentNanoUSD != ledger.Entries[0].Amount || sp.ReservedNanoUSD != 0 {
				t.Errorf("spend after the call: got %s, want spent %d", b, ledger.Entries[0].Amount)
			}
			if st, b := f.do(t, "GET", "/api/admin/budget/ledger?since=yesterday", adminToken, ""); st != 400 {
				t.Errorf("bad since: got %d %s", st, b)
			}
			// Limit 0 refuses the next call with the budget 429.
			f.do(t, "PUT", "/api/admin/budget/users/alice/limit", adminToken, `{"limit_nano_usd":0}`)
			if st := f.modelCall(t, "alice"); st != http.StatusTooManyRequests {
				t.Errorf("call over the limit: got %d, want 429", st)
			}
			if st, _ := f.do(t, "DELETE", "/api/admin/budget/users/alice/limit", adminToken, ""); st != 204 {
				t.Errorf("clear limit: got %d", st)
			}
			_, b = f.do(t, "GET", "/api/admin/budget/users/alice?tenant=acme", adminToken, "")
			if json.Unmarshal(b, &sp); sp.LimitSource != "tenant" {
				t.Errorf("after clearing: got %s, want the tenant's limit", b)
			}
			// Metrics name tenants and spend: with an admin token set they
			// need it.
			if st, _ := f.do(t, "GET", "/metrics", "", ""); st != http.StatusUnauthorized {
				t.Errorf("metrics without the admin token: got %d, want 401", st)
			}
			st, b = f.do(t, "GET", "/metrics", adminToken, "")
			for _, want := range []string{`talkide_gateway_requests_total{code="200",path="/v1/messages"} 1`,
				`talkide_gateway_denials_total{reason="budget"} 1`, `talkide_gateway_inflight_streams 0`,
				`talkide_gateway_settlements_total{outcome="complete",result="booked"} 1`, `talkide_gateway_tokens_total{kind="output",model="talkide-dev-upstream"}`,
				`talkide_budget_precall_check_seconds_count{result="admitted"} 1`, `talkide_gateway_overhead_seconds_bucket`} {
				if st != 200 || !strings.Contains(string(b), want) {
					t.Errorf("metrics lack %s", want)
				}
			}
		})
	}
}

func TestBudgetAdminAPIDisabledWithoutToken(t *testing.T) {
	f := startControlPlane(t, "", "")
	if st, b := f.do(t, "GET", "/api/admin/budget/users/alice", "", ""); st != http.StatusForbidden || !strings.Contains(string(b), "TALKIDE_ADMIN_TOKEN") {
		t.Errorf("got %d %s, want 403 naming TALKIDE_ADMIN_TOKEN", st, b)
	}
}

func TestConfigRejectsBadDatabaseURLAndShortAdminToken(t *testing.T) {
	mk, _ := token.NewMasterKey("k")
	for _, c := range []Config{
		{MasterKeys: []token.MasterKey{mk}, DatabaseURL: "mysql://x"},
		{MasterKeys: []token.MasterKey{mk}, AdminToken: "short"},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func waitABit() { <-time.After(20 * time.Millisecond) }
