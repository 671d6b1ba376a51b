// Package mcphost serves an MCP server (built with the official MCP Go
// SDK) inside the worker to one Claude Code process over the CLI's control
// protocol (see harness/mcp.go): Handler adapts one MCP server session to
// the harness's one-message-at-a-time interface (harness.MCPHandler) with
// an in-process transport, so no port or secret exists. The worker's
// hosted servers (talkide-issue-tracking, talkide-build) use it.
package mcphost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Open starts a session of srv for one CLI process. Close it when the
// process ends. Errors are the SDK's, when the session cannot start.
func Open(srv *mcp.Server) (*Handler, error) {
	c := &conn{in: make(chan jsonrpc.Message, 16), waiting: map[jsonrpc.ID]chan *jsonrpc.Response{}, closed: make(chan struct{})}
	ss, err := srv.Connect(context.Background(), transport{c}, nil)
	if err != nil {
		return nil, fmt.Errorf("start MCP server session: %w", err)
	}
	return &Handler{conn: c, session: ss}, nil
}

// Handler serves one MCP session of the server for one CLI process over
// the harness's message interface (harness.MCPHandler).
type Handler struct {
	conn    *conn
	session *mcp.ServerSession
}

// Close ends the session.
func (h *Handler) Close() { h.session.Close() }

// HandleMCP implements harness.MCPHandler: it feeds one JSON-RPC message to
// the session and returns the response of a request (nil for a
// notification).
func (h *Handler) HandleMCP(ctx context.Context, raw json.RawMessage) (json.RawMessage, error) {
	msg, err := jsonrpc.DecodeMessage(raw)
	if err != nil {
		return nil, fmt.Errorf("decode MCP message: %w", err)
	}
	req, ok := msg.(*jsonrpc.Request)
	if !ok {
		return nil, nil // a response to a request the server never sends
	}
	var ch chan *jsonrpc.Response
	if req.IsCall() {
		ch = make(chan *jsonrpc.Response, 1)
		h.conn.mu.Lock()
		h.conn.waiting[req.ID] = ch
		h.conn.mu.Unlock()
		defer func() {
			h.conn.mu.Lock()
			delete(h.conn.waiting, req.ID)
			h.conn.mu.Unlock()
		}()
	}
	select {
	case h.conn.in <- req:
	case <-h.conn.closed:
		return nil, errors.New("MCP session closed")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if ch == nil {
		return nil, nil
	}
	select {
	case resp := <-ch:
		return jsonrpc.EncodeMessage(resp)
	case <-h.conn.closed:
		return nil, errors.New("MCP session closed")
	case <-ctx.Done():
		// The handler runs under the session's context, not ctx: tell the
		// session the call is cancelled (MCP's notifications/cancelled),
		// which ends the handler's context (a build stops with it).
		h.cancel(req.ID)
		return nil, ctx.Err()
	}
}

// cancel sends the session a notifications/cancelled for request id.
func (h *Handler) cancel(id jsonrpc.ID) {
	params, err := json.Marshal(map[string]any{"requestId": id.Raw(), "reason": "the turn was interrupted"})
	if err != nil {
		return
	}
	n := &jsonrpc.Request{Method: "notifications/cancelled", Params: params}
	select {
	case h.conn.in <- n:
	case <-h.conn.closed:
	case <-time.After(time.Second):
	}
}

// transport hands the SDK a connection whose messages come from the CLI's
// control requests.
type transport struct{ c *conn }

func (t transport) Connect(context.Context) (mcp.Connection, error) { return t.c, nil }

// conn is an mcp.Connection fed by Handler.HandleMCP.
type conn struct {
	in chan jsonrpc.Message

	mu sync.Mutex
	// waiting maps a request id to the channel of its response; guarded by mu.
	waiting map[jsonrpc.ID]chan *jsonrpc.Response
	// closed is closed by Close; isClosed guards it; guarded by mu.
	closed   chan struct{}
	isClosed bool
}

func (c *conn) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case m := <-c.in:
		return m, nil
	case <-c.closed:
		return nil, mcp.ErrConnectionClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Write delivers a response to its waiting HandleMCP call. Requests and
// notifications the server starts (none of this server's tools do) have
// no way to the CLI and are dropped.
func (c *conn) Write(_ context.Context, m jsonrpc.Message) error {
	resp, ok := m.(*jsonrpc.Response)
	if !ok {
		return nil
	}
	c.mu.Lock()
	ch := c.waiting[resp.ID]
	c.mu.Unlock()
	if ch != nil {
		select {
		case ch <- resp:
		default:
		}
	}
	return nil
}

func (c *conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.isClosed {
		c.isClosed = true
		close(c.closed)
	}
	return nil
}

func (c *conn) SessionID() string { return "" }
