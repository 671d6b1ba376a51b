package gateway_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/gateway"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/token"
)

// countingTransport counts the requests a client sends.
type countingTransport struct{ n atomic.Int32 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

// sdkClient is the official Anthropic Go SDK set up as docs/direct-sdk.md
// says: the gateway as base URL, the WorkerToken in X-Worker-Token, the
// SDK's default retries. Its requests are counted.
func sdkClient(f *fixture, tok string) (sdk.Client, *countingTransport) {
	ct := &countingTransport{}
	return sdk.NewClient(
		option.WithoutEnvironmentDefaults(),
		option.WithBaseURL(f.gw.URL+contract.PathGatewayPrefix+"/"),
		option.WithAPIKey("unused"), // the gateway drops it and adds its own
		option.WithHeader(contract.HeaderWorkerToken, tok),
		option.WithHTTPClient(&http.Client{Transport: ct}),
	), ct
}

var sdkParams = sdk.MessageNewParams{
	Model:     "claude-sonnet-4-5",
	MaxTokens: 1024,
	Messages:  []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock("hello"))},
}

// sdkErrorCode is error.details.error_code of an SDK error's body.
func sdkErrorCode(t *testing.T, e *sdk.Error) string {
	t.Helper()
	var env struct {
		Error struct {
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(e.RawJSON()), &env); err != nil {
		t.Fatalf("error body %q: %v", e.RawJSON(), err)
	}
	code, _ := env.Error.Details["error_code"].(string)
	return code
}

// scriptTransient429 makes the upstream answer f's next call with a rate
// limit to retry at once.
func scriptTransient429(f *fixture) {
	f.up.Script(devupstream.Response{Error: &devupstream.APIError{Status: 429, Type: "rate_limit_error", Message: "slow down",
		Header: map[string]string{"retry-after": "0"}}})
}

// expiredWorkerToken is a WorkerToken for convID that expired a minute ago.
func expiredWorkerToken(t *testing.T, f *fixture) string {
	t.Helper()
	tok, err := token.NewSigner(token.PurposeGateway, f.master.Derive(token.PurposeGateway, "", "")).
		Sign(token.Claims{Tenant: tenant, Env: env, Conversation: convID, User: userID}, -time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestGatewayWithOfficialGoSDK: a direct SDK client over real HTTP can tell
// the gateway's answers apart by status and headers alone, as the SDK's
// retry logic does: it retries a transient 429 (the upstream's rate
// limit), does not retry a budget denial (x-should-retry: false, with
// retry-after until the period resets), and does not resend an expired
// WorkerToken, whose 401 names worker_token_expired so the client re-mints.
func TestGatewayWithOfficialGoSDK(t *testing.T) {
	t.Run("transient 429 is retried", func(t *testing.T) {
		f := newFixture(t)
		scriptTransient429(f)
		c, ct := sdkClient(f, f.workerToken(t, convID, userID))
		msg, err := c.Messages.New(t.Context(), sdkParams)
		if err != nil {
			t.Fatalf("Messages.New: %v; want success after a retry", err)
		}
		if len(msg.Content) == 0 {
			t.Error("answer has no content")
		}
		if n := ct.n.Load(); n != 2 {
			t.Errorf("requests the SDK sent: got %d, want 2 (one retry)", n)
		}
	})

	t.Run("streaming and count_tokens", func(t *testing.T) {
		f := newFixture(t)
		c, _ := sdkClient(f, f.workerToken(t, convID, userID))
		stream := c.Messages.NewStreaming(t.Context(), sdkParams)
		var msg sdk.Message
		events := 0
		for stream.Next() {
			events++
			if err := msg.Accumulate(stream.Current()); err != nil {
				t.Fatalf("accumulate: %v", err)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		if events < 3 || len(msg.Content) == 0 || msg.Content[0].Text == "" || msg.Usage.OutputTokens == 0 || msg.StopReason == "" {
			t.Errorf("streamed message after %d events: %+v", events, msg)
		}
		n, err := c.Messages.CountTokens(t.Context(), sdk.MessageCountTokensParams{Model: sdkParams.Model, Messages: sdkParams.Messages})
		if err != nil || n.InputTokens <= 0 {
			t.Errorf("CountTokens: %+v, %v", n, err)
		}
	})

	t.Run("a refusal names its request id", func(t *testing.T) {
		f := newFixture(t)
		if err := f.budget.SetUserLimit(t.Context(), userID, 1000); err != nil {
			t.Fatal(err)
		}
		c, _ := sdkClient(f, f.workerToken(t, convID, userID))
		_, err := c.Messages.New(t.Context(), sdkParams)
		var e *sdk.Error
		if !errors.As(err, &e) {
			t.Fatalf("Messages.New: %v", err)
		}
		var env struct {
			RequestID string `json:"request_id"`
		}
		json.Unmarshal([]byte(e.RawJSON()), &env)
		// The SDK reads the request-id header; the body and the message's
		// end carry the same id (behind the control plane it is also its
		// X-Request-Id: internal/e2e/requestid_test.go).
		if e.RequestID == "" || env.RequestID != e.RequestID || !strings.HasSuffix(e.Message, "(request "+e.RequestID+")") {
			t.Errorf("SDK request id %q, body %q, message %q: want one id everywhere", e.RequestID, env.RequestID, e.Message)
		}
	})

	t.Run("budget 429 is not retried", func(t *testing.T) {
		f := newFixture(t)
		if err := f.budget.SetUserLimit(t.Context(), userID, 1000); err != nil {
			t.Fatal(err)
		}
		c, ct := sdkClient(f, f.workerToken(t, convID, userID))
		_, err := c.Messages.New(t.Context(), sdkParams)
		var e *sdk.Error
		if !errors.As(err, &e) || e.StatusCode != http.StatusTooManyRequests || e.Type() != "rate_limit_error" {
			t.Fatalf("Messages.New: got %v, want a 429 rate_limit_error", err)
		}
		if n := ct.n.Load(); n != 1 {
			t.Errorf("requests the SDK sent: got %d, want 1 (no retry)", n)
		}
		if e.Response.Header.Get("x-should-retry") != "false" {
			t.Errorf("x-should-retry: got %q, want false", e.Response.Header.Get("x-should-retry"))
		}
		if ra, err := strconv.Atoi(e.Response.Header.Get("retry-after")); err != nil || ra < 1 || ra > 31*24*3600 {
			t.Errorf("retry-after: got %q, want the seconds until the month ends", e.Response.Header.Get("retry-after"))
		}
		if !strings.HasPrefix(e.Message, gateway.MsgBudgetExhausted) || sdkErrorCode(t, e) != contract.ErrCodeBudgetExceeded {
			t.Errorf("message %q, code %q: want %q… and %s", e.Message, sdkErrorCode(t, e), gateway.MsgBudgetExhausted, contract.ErrCodeBudgetExceeded)
		}
		if n := f.rec.arrivals.Load(); n != 0 {
			t.Errorf("upstream: got %d requests, want none", n)
		}
	})

	t.Run("expired token is not resent", func(t *testing.T) {
		f := newFixture(t)
		expired := expiredWorkerToken(t, f)
		c, ct := sdkClient(f, expired)
		_, err := c.Messages.New(t.Context(), sdkParams)
		var e *sdk.Error
		if !errors.As(err, &e) || e.StatusCode != http.StatusUnauthorized || e.Type() != "authentication_error" {
			t.Fatalf("Messages.New: got %v, want a 401 authentication_error", err)
		}
		if n := ct.n.Load(); n != 1 {
			t.Errorf("requests the SDK sent: got %d, want 1 (the same token would fail again)", n)
		}
		if code := sdkErrorCode(t, e); code != contract.ErrCodeTokenExpired {
			t.Errorf("error_code: got %q, want %s", code, contract.ErrCodeTokenExpired)
		}
		// Re-minting (here: signing a fresh token as the mint would) and
		// sending again succeeds.
		c2, _ := sdkClient(f, f.workerToken(t, convID, userID))
		if _, err := c2.Messages.New(t.Context(), sdkParams); err != nil {
			t.Errorf("with a fresh token: %v", err)
		}
	})
}
