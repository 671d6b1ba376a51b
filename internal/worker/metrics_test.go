package worker_test

import (
	"net/http"
	"testing"

	"github.com/talkide/talkide/internal/worker"
)

// testMetricsToken is the metrics token of the workers these tests start.
const testMetricsToken = "metrics-token-of-the-tests-0123456789"

// TestWorkerMetricsNeedAToken guards against case C7 on the worker: its
// /metrics answered anyone on loopback, the agent included. It needs
// TALKIDE_METRICS_TOKEN now; without one configured it is refused.
func TestWorkerMetricsNeedAToken(t *testing.T) {
	for _, tc := range []struct {
		name, configured, sent string
		want                   int
	}{
		{"no token configured", "", "", http.StatusForbidden},
		{"no token configured, one sent", "", testMetricsToken, http.StatusForbidden},
		{"token missing", testMetricsToken, "", http.StatusUnauthorized},
		{"wrong token", testMetricsToken, "wrong-token-0123456789abcdef", http.StatusUnauthorized},
		{"right token", testMetricsToken, testMetricsToken, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := startTenantWorker(t, "acme", func(c *worker.Config) {
				c.AgentUser = "self"
				c.MetricsToken = tc.configured
			})
			req, _ := http.NewRequest("GET", w.url+"/metrics", nil)
			if tc.sent != "" {
				req.Header.Set("Authorization", "Bearer "+tc.sent)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("GET /metrics from loopback: got %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
}
