// Command direct-sdk calls the TalkIDE gateway-proxy with the official
// Anthropic Go SDK, as a client outside the worker would: it mints
// WorkerTokens at the mint endpoint with a worker identity token and
// re-mints when the gateway answers 401 worker_token_expired
// (docs/direct-sdk.md).
//
//	TALKIDE_GATEWAY_BASE_URL=http://127.0.0.1:8080 \
//	TALKIDE_WORKER_IDENTITY_TOKEN=... \
//	go run ./docs/examples/direct-sdk <conversation-id> "Say hello"
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// minter mints WorkerTokens for one conversation and keeps the current one
// until shortly before it expires.
type minter struct {
	base, identity, conversation string

	mu      sync.Mutex
	token   string
	expires time.Time
}

// get returns a token valid for at least 15 s more, minting one if needed.
func (m *minter) get(ctx context.Context, fresh bool) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !fresh && m.token != "" && time.Until(m.expires) > 15*time.Second {
		return m.token, nil
	}
	body, _ := json.Marshal(map[string]string{"conversation_id": m.conversation})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.base+"/api/v1/worker-gateway/token/mint", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+m.identity)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("mint: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return "", fmt.Errorf("mint: %s: %s", resp.Status, b)
	}
	var out struct {
		Token     string    `json:"token"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", fmt.Errorf("mint: %w", err)
	}
	m.token, m.expires = out.Token, out.ExpiresAt
	return m.token, nil
}

// tokenExpired reports whether resp is the gateway's 401 for an expired
// WorkerToken (error.details.error_code "worker_token_expired"). It leaves
// resp's body readable.
func tokenExpired(resp *http.Response) bool {
	if resp.StatusCode != http.StatusUnauthorized {
		return false
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	var env struct {
		Error struct {
			Details struct {
				ErrorCode string `json:"error_code"`
			} `json:"details"`
		} `json:"error"`
	}
	return json.Unmarshal(b, &env) == nil && env.Error.Details.ErrorCode == "worker_token_expired"
}

// workerToken is SDK middleware: every attempt carries a valid WorkerToken,
// and a 401 for an expired one is sent once more with a freshly minted one.
func (m *minter) workerToken(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	tok, err := m.get(req.Context(), false)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Worker-Token", tok)
	resp, err := next(req)
	if err != nil || !tokenExpired(resp) || req.GetBody == nil {
		return resp, err
	}
	resp.Body.Close()
	if tok, err = m.get(req.Context(), true); err != nil {
		return nil, err
	}
	retry := req.Clone(req.Context())
	if retry.Body, err = req.GetBody(); err != nil {
		return nil, err
	}
	retry.Header.Set("X-Worker-Token", tok)
	return next(retry)
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: direct-sdk <conversation-id> <prompt>")
		os.Exit(2)
	}
	m := &minter{
		base:         strings.TrimSuffix(os.Getenv("TALKIDE_GATEWAY_BASE_URL"), "/"),
		identity:     os.Getenv("TALKIDE_WORKER_IDENTITY_TOKEN"),
		conversation: os.Args[1],
	}
	client := anthropic.NewClient(
		option.WithoutEnvironmentDefaults(),
		option.WithBaseURL(m.base+"/api/internal/gateway/anthropic/"),
		option.WithAPIKey("unused"), // the gateway drops it and adds the real key
		option.WithMiddleware(m.workerToken),
	)
	msg, err := client.Messages.New(context.Background(), anthropic.MessageNewParams{
		Model:     "claude-sonnet-4-5",
		MaxTokens: 1024,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(os.Args[2]))},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, c := range msg.Content {
		fmt.Println(c.Text)
	}
}
