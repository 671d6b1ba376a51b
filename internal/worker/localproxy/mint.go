package localproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
)

// MintClient calls the mint endpoint with the worker's identity token.
type MintClient struct {
	// Base is $TALKIDE_GATEWAY_BASE_URL.
	Base *url.URL
	// Identity supplies the identity token and learns of the mint's
	// refusals. Required.
	Identity *Identity
	// HTTP is the client used; nil means a client with a 10 s timeout.
	HTTP *http.Client
}

// maxMintAttempts bounds the mints of one Mint call: the first, and
// retries with a token rotated into the identity file meanwhile.
const maxMintAttempts = 3

// MintError is a refusal from the mint endpoint.
type MintError struct {
	Status int
	Type   string
	Msg    string
}

func (e *MintError) Error() string {
	return fmt.Sprintf("mint refused: %d %s: %s", e.Status, e.Type, e.Msg)
}

// defaultMintHTTP is the mint client's HTTP client when MintClient.HTTP
// is nil: 10 s per mint, and as many kept-alive connections to the control
// plane as conversations mint at once (up to 64), since every model call
// mints first; Go's default keeps two, so concurrent calls each opened a
// connection of their own.
var defaultMintHTTP = &http.Client{Timeout: 10 * time.Second, Transport: mintTransport()}

func mintTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return t
}

// Mint asks for a WorkerToken for conversation conv. When the mint answers
// 401 and the identity file holds a newer token (a rotation), it retries
// with that one at once. It returns a *MintError when the endpoint answers
// with an error status (after a 401, c.Identity has recorded the failure),
// or a transport error.
func (c *MintClient) Mint(ctx context.Context, conv string) (contract.MintResponse, error) {
	tok := c.Identity.Token()
	for attempt := 1; ; attempt++ {
		mr, err := c.mint(ctx, conv, tok)
		if err == nil {
			c.Identity.accepted(tok)
			return mr, nil
		}
		var me *MintError
		if !errors.As(err, &me) || me.Status != http.StatusUnauthorized || attempt == maxMintAttempts {
			return mr, err
		}
		next, ok := c.Identity.refused(tok, me.Msg)
		if !ok {
			return mr, err
		}
		tok = next
	}
}

func (c *MintClient) mint(ctx context.Context, conv, identity string) (contract.MintResponse, error) {
	body, _ := json.Marshal(contract.MintRequest{ConversationID: conv})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, httpapi.JoinURL(c.Base, contract.PathMint).String(), bytes.NewReader(body))
	if err != nil {
		return contract.MintResponse{}, fmt.Errorf("mint: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+identity)
	httpapi.SetRequestID(req) // the model call's id, in the mint's log lines too
	hc := c.HTTP
	if hc == nil {
		hc = defaultMintHTTP
	}
	resp, err := hc.Do(req)
	if err != nil {
		return contract.MintResponse{}, fmt.Errorf("mint: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return contract.MintResponse{}, fmt.Errorf("mint: read answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var eb contract.ErrorBody
		_ = json.Unmarshal(b, &eb)
		return contract.MintResponse{}, &MintError{Status: resp.StatusCode, Type: eb.Error.Type, Msg: eb.Error.Message}
	}
	var mr contract.MintResponse
	if err := json.Unmarshal(b, &mr); err != nil || mr.Token == "" {
		return contract.MintResponse{}, fmt.Errorf("mint: malformed answer: %v", err)
	}
	return mr, nil
}
