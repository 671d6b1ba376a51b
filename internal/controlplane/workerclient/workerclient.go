// Package workerclient is the control plane's client of one worker's API
// (package contract): every request carries a fresh request token signed for
// the worker's tenant-env and bound to the request's method, path and body.
//
// Main types: Client and EventStream (a reader of the worker's SSE event
// stream). Transport failures wrap ErrUnavailable; error answers are *Error.
// It does not retry; callers decide.
package workerclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/sse"
	"github.com/talkide/talkide/internal/token"
)

// ErrUnavailable wraps failures to reach the worker at all.
var ErrUnavailable = errors.New("worker unavailable")

// Error is an error answer of the worker.
type Error struct {
	Status int
	Type   string
	Msg    string
}

func (e *Error) Error() string {
	return fmt.Sprintf("worker answered %d %s: %s", e.Status, e.Type, e.Msg)
}

// Client calls one worker.
type Client struct {
	base        *url.URL
	tenant, env string
	signer      *token.Signer
	http        *http.Client
	stream      *http.Client
}

// New returns a client of the worker at base serving (tenant, env), signing
// with key (the worker-request key of that tenant-env).
func New(base *url.URL, tenant, env string, key token.Key) *Client {
	return NewWithTransport(base, tenant, env, key, nil)
}

// NewWithTransport is New reaching the worker through rt (nil:
// http.DefaultTransport); the control plane's counts its sockets in its
// open-files budget.
func NewWithTransport(base *url.URL, tenant, env string, key token.Key, rt http.RoundTripper) *Client {
	return &Client{
		base: base, tenant: tenant, env: env,
		signer: token.NewSigner(token.PurposeWorkerRequest, key),
		http:   &http.Client{Timeout: 30 * time.Second, Transport: rt},
		stream: &http.Client{Transport: rt}, // no timeout: the event stream is long-lived; ctx bounds it
	}
}

func (c *Client) newRequest(ctx context.Context, method, path string, body []byte) (*http.Request, error) {
	u := httpapi.JoinURL(c.base, path)
	req, err := http.NewRequestWithContext(ctx, method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	httpapi.SetRequestID(req) // the browser request's id, in the worker's log too
	tok, err := c.signer.Sign(token.RequestClaims(c.tenant, c.env, method, req.URL.RequestURI(), body), token.RequestTokenTTL)
	if err != nil {
		return nil, err
	}
	req.Header.Set(contract.HeaderWorkerToken, tok)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	req, err := c.newRequest(ctx, method, path, body)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err) // callers tell EMFILE from a worker down
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%w: read answer: %v", ErrUnavailable, err)
	}
	if resp.StatusCode >= 300 {
		return decodeError(resp.StatusCode, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("decode worker answer: %w", err)
		}
	}
	return nil
}

func decodeError(status int, b []byte) error {
	var eb contract.ErrorBody
	if json.Unmarshal(b, &eb) != nil || eb.Error.Type == "" {
		return &Error{Status: status, Type: contract.ErrTypeUpstream, Msg: strings.TrimSpace(string(b))}
	}
	return &Error{Status: status, Type: eb.Error.Type, Msg: eb.Error.Message}
}

func path(tmpl, conv string) string { return strings.Replace(tmpl, "{id}", url.PathEscape(conv), 1) }

// CreateSession creates or returns conv's session.
func (c *Client) CreateSession(ctx context.Context, conv string, req contract.CreateSessionRequest) (contract.SessionStatus, error) {
	var st contract.SessionStatus
	err := c.do(ctx, http.MethodPost, path(contract.PathSession, conv), req, &st)
	return st, err
}

// SendMessage sends a user message (idempotent by ClientMessageID).
func (c *Client) SendMessage(ctx context.Context, conv string, req contract.SendMessageRequest) (contract.SendMessageResponse, error) {
	var out contract.SendMessageResponse
	err := c.do(ctx, http.MethodPost, path(contract.PathMessages, conv), req, &out)
	return out, err
}

// Interrupt interrupts conv's running turn.
func (c *Client) Interrupt(ctx context.Context, conv string) (contract.InterruptResponse, error) {
	var out contract.InterruptResponse
	err := c.do(ctx, http.MethodPost, path(contract.PathInterrupt, conv), nil, &out)
	return out, err
}

// Stop stops conv's CLI process.
func (c *Client) Stop(ctx context.Context, conv string) (contract.SessionStatus, error) {
	var st contract.SessionStatus
	err := c.do(ctx, http.MethodPost, path(contract.PathStop, conv), nil, &st)
	return st, err
}

// AnswerPermission answers permission request id of conv.
func (c *Client) AnswerPermission(ctx context.Context, conv, id string, a contract.PermissionAnswer) (contract.PermissionResolved, error) {
	var out contract.PermissionResolved
	p := strings.Replace(path(contract.PathPermission, conv), "{request_id}", url.PathEscape(id), 1)
	err := c.do(ctx, http.MethodPost, p, a, &out)
	return out, err
}

// Status returns conv's status.
func (c *Client) Status(ctx context.Context, conv string) (contract.SessionStatus, error) {
	var st contract.SessionStatus
	err := c.do(ctx, http.MethodGet, path(contract.PathStatus, conv), nil, &st)
	return st, err
}

// Info returns the worker's description: the replica that answered and
// its agent containment's guarantees (GET /v1/worker).
func (c *Client) Info(ctx context.Context) (contract.WorkerInfo, error) {
	var info contract.WorkerInfo
	err := c.do(ctx, http.MethodGet, contract.PathWorker, nil, &info)
	return info, err
}

// Ready reports whether the worker's /readyz answers 200.
func (c *Client) Ready(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, httpapi.JoinURL(c.base, "/readyz").String(), nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err) // callers tell EMFILE from a worker down
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: readyz answered %d", ErrUnavailable, resp.StatusCode)
	}
	return nil
}

// EventStream reads a conversation's events from the worker.
type EventStream struct {
	body io.ReadCloser
	r    *sse.Reader
}

// Events opens conv's event stream after event id after. Close the stream
// when done; cancelling ctx also ends it.
func (c *Client) Events(ctx context.Context, conv string, after int64) (*EventStream, error) {
	req, err := c.newRequest(ctx, http.MethodGet, path(contract.PathEvents, conv), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(contract.HeaderLastEventID, strconv.FormatInt(after, 10))
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.stream.Do(req)
	if err != nil {
		// %w twice: callers tell this process's own exhaustion (EMFILE)
		// from a worker that is down.
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return nil, decodeError(resp.StatusCode, b)
	}
	return &EventStream{body: resp.Body, r: sse.NewReader(resp.Body)}, nil
}

// Next returns the next event. Errors: io.EOF when the worker ended the
// stream, a wrapped ErrUnavailable when it broke, or a decode error.
func (s *EventStream) Next() (contract.Event, error) {
	e, err := s.r.Next()
	if err != nil {
		if err == io.EOF {
			return contract.Event{}, io.EOF
		}
		return contract.Event{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	var ev contract.Event
	if err := json.Unmarshal(e.Data, &ev); err != nil {
		return contract.Event{}, fmt.Errorf("decode worker event %q: %w", e.ID, err)
	}
	if strconv.FormatInt(ev.ID, 10) != e.ID || string(ev.Type) != e.Type {
		return contract.Event{}, fmt.Errorf("decode worker event %q: id or type differs from the SSE fields", e.ID)
	}
	return ev, nil
}

// Close ends the stream.
func (s *EventStream) Close() error { return s.body.Close() }
