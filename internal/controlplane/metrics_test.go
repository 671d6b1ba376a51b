package controlplane

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/talkide/talkide/internal/token"
)

// TestMetricsNeedATokenAlways guards against case C7: without
// TALKIDE_ADMIN_TOKEN (the `make run` default) the control plane served
// /metrics (tenants and their spend) to every loopback client, and on one
// machine the agents are loopback clients. Now /metrics needs the metrics
// token (or the admin token) from anywhere, and with neither configured it
// is refused.
func TestMetricsNeedATokenAlways(t *testing.T) {
	const metricsToken, adminToken = "metrics-token-0123456789abcdef", "admin-token-0123456789abcdef"
	for _, tc := range []struct {
		name, metrics, admin, sent string
		want                       int
	}{
		{"nothing configured, from loopback", "", "", "", http.StatusForbidden},
		{"metrics token configured, none sent", metricsToken, "", "", http.StatusUnauthorized},
		{"metrics token configured, wrong one sent", metricsToken, "", "wrong-token-0123456789abcdef", http.StatusUnauthorized},
		{"metrics token", metricsToken, "", metricsToken, http.StatusOK},
		{"admin token", metricsToken, adminToken, adminToken, http.StatusOK},
		{"admin token only, none sent", "", adminToken, "", http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			master, _ := token.NewMasterKey("k1")
			cfg := Config{DBPath: filepath.Join(t.TempDir(), "cp.db"), MasterKeys: []token.MasterKey{master},
				MetricsToken: tc.metrics, AdminToken: tc.admin, Logger: slog.New(slog.DiscardHandler)}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			db, err := OpenDB(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			spend := newSpendParts(cfg, db)
			s, _ := NewServer(cfg, db, spend)
			srv := httptest.NewServer(s) // a loopback listener
			t.Cleanup(func() { srv.Close(); spend.close(); db.Close() })
			req, _ := http.NewRequest("GET", srv.URL+"/metrics", nil)
			if tc.sent != "" {
				req.Header.Set("Authorization", "Bearer "+tc.sent)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("GET /metrics: got %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
}

func TestMetricsTokenTooShortIsRefused(t *testing.T) {
	master, _ := token.NewMasterKey("k1")
	cfg := Config{MasterKeys: []token.MasterKey{master}, MetricsToken: "short"}
	if err := cfg.Validate(); err == nil {
		t.Error("a 5-character metrics token was accepted")
	}
}
