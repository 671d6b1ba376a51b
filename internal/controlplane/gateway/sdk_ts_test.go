package gateway_test

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/gateway"
)

// tsSDKDir holds the pinned official TypeScript SDK (make sdk-ts) and the
// script that drives it.
const tsSDKDir = "testdata/ts-sdk"

// tsResult is what testdata/ts-sdk/check.mjs saw.
type tsResult struct {
	Text         string `json:"text"`
	Events       int    `json:"events"`
	StopReason   string `json:"stop_reason"`
	OutputTokens int    `json:"output_tokens"`
	InputTokens  int    `json:"input_tokens"`
	Requests     int    `json:"requests"`
	Error        *struct {
		Class         string `json:"class"`
		Status        int    `json:"status"`
		Type          string `json:"type"`
		Message       string `json:"message"`
		ErrorCode     string `json:"error_code"`
		RequestID     string `json:"request_id"`
		BodyRequestID string `json:"body_request_id"`
		ShouldRetry   string `json:"should_retry"`
		RetryAfter    string `json:"retry_after"`
	} `json:"error"`
}

// runTSSDK runs check.mjs's scenario against f's gateway with WorkerToken tok.
func runTSSDK(t *testing.T, f *fixture, tok, scenario string) tsResult {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found: this test drives the official TypeScript SDK with it (Debian: apt-get install nodejs npm): %v", err)
	}
	if _, err := os.Stat(filepath.Join(tsSDKDir, "node_modules", "@anthropic-ai", "sdk", "package.json")); err != nil {
		t.Fatalf("the TypeScript SDK is not installed in %s: run `make sdk-ts` (make test does): %v", tsSDKDir, err)
	}
	cmd := exec.CommandContext(t.Context(), node, "check.mjs", scenario)
	cmd.Dir = tsSDKDir
	cmd.Env = append(os.Environ(), "GATEWAY_BASE_URL="+f.gw.URL+contract.PathGatewayPrefix+"/", "WORKER_TOKEN="+tok)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("node check.mjs %s: %v\n%s%s", scenario, err, out, stderr)
	}
	var r tsResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("node check.mjs %s printed %q: %v", scenario, out, err)
	}
	return r
}

// TestGatewayWithOfficialTypeScriptSDK is TestGatewayWithOfficialGoSDK for
// the official TypeScript SDK (@anthropic-ai/sdk, pinned in
// testdata/ts-sdk), run by Node over real HTTP: messages, streaming and
// count_tokens work unchanged; a transient 429 is retried; a budget denial
// and an expired WorkerToken are typed errors that are not retried and
// name their cause and request id.
func TestGatewayWithOfficialTypeScriptSDK(t *testing.T) {
	t.Run("transient 429 is retried", func(t *testing.T) {
		f := newFixture(t)
		scriptTransient429(f)
		r := runTSSDK(t, f, f.workerToken(t, convID, userID), "message")
		if r.Error != nil || r.Text == "" || r.Requests != 2 {
			t.Errorf("got %+v (error %+v); want an answer after one retry (2 requests)", r, r.Error)
		}
	})

	t.Run("streaming and count_tokens", func(t *testing.T) {
		f := newFixture(t)
		tok := f.workerToken(t, convID, userID)
		r := runTSSDK(t, f, tok, "stream")
		if r.Error != nil || r.Events < 3 || r.Text == "" || r.StopReason == "" || r.OutputTokens == 0 {
			t.Errorf("stream: got %+v (error %+v)", r, r.Error)
		}
		r = runTSSDK(t, f, tok, "count_tokens")
		if r.Error != nil || r.InputTokens <= 0 {
			t.Errorf("count_tokens: got %+v (error %+v)", r, r.Error)
		}
	})

	t.Run("budget 429 is not retried", func(t *testing.T) {
		f := newFixture(t)
		if err := f.budget.SetUserLimit(t.Context(), userID, 1000); err != nil {
			t.Fatal(err)
		}
		r := runTSSDK(t, f, f.workerToken(t, convID, userID), "refusal")
		e := r.Error
		if e == nil || e.Class != "RateLimitError" || e.Status != http.StatusTooManyRequests || e.Type != "rate_limit_error" {
			t.Fatalf("got %+v (error %+v), want a RateLimitError", r, e)
		}
		if r.Requests != 1 || e.ShouldRetry != "false" {
			t.Errorf("requests %d, x-should-retry %q: want 1 (no retry), false", r.Requests, e.ShouldRetry)
		}
		if ra, err := strconv.Atoi(e.RetryAfter); err != nil || ra < 1 || ra > 31*24*3600 {
			t.Errorf("retry-after: got %q, want the seconds until the month ends", e.RetryAfter)
		}
		if !strings.HasPrefix(e.Message, gateway.MsgBudgetExhausted) || e.ErrorCode != contract.ErrCodeBudgetExceeded {
			t.Errorf("message %q, error_code %q: want %q… and %s", e.Message, e.ErrorCode, gateway.MsgBudgetExhausted, contract.ErrCodeBudgetExceeded)
		}
		if e.RequestID == "" || e.BodyRequestID != e.RequestID || !strings.HasSuffix(e.Message, "(request "+e.RequestID+")") {
			t.Errorf("SDK request id %q, body %q, message %q: want one id everywhere", e.RequestID, e.BodyRequestID, e.Message)
		}
		if n := f.rec.arrivals.Load(); n != 0 {
			t.Errorf("upstream: got %d requests, want none", n)
		}
	})

	t.Run("expired token is not resent", func(t *testing.T) {
		f := newFixture(t)
		expired := expiredWorkerToken(t, f)
		r := runTSSDK(t, f, expired, "refusal")
		e := r.Error
		if e == nil || e.Class != "AuthenticationError" || e.Status != http.StatusUnauthorized || e.ErrorCode != contract.ErrCodeTokenExpired {
			t.Fatalf("got %+v (error %+v), want an AuthenticationError with error_code %s", r, e, contract.ErrCodeTokenExpired)
		}
		if r.Requests != 1 {
			t.Errorf("requests the SDK sent: got %d, want 1 (the same token would fail again)", r.Requests)
		}
		if r := runTSSDK(t, f, f.workerToken(t, convID, userID), "message"); r.Error != nil || r.Text == "" {
			t.Errorf("with a fresh token: got %+v (error %+v)", r, r.Error)
		}
		// docs/direct-sdk.md's TypeScript fetch wrapper re-mints on its
		// own: the stand-in mint hands out the expired token, then a fresh one.
		r = runTSSDK(t, f, expired+","+f.workerToken(t, convID, userID), "remint")
		if r.Error != nil || r.Text == "" || r.Requests != 2 {
			t.Errorf("remint: got %+v (error %+v); want an answer after 2 requests (expired, then re-minted)", r, r.Error)
		}
	})
}
