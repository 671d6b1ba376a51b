package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/google/uuid"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/sandbox"
	"github.com/talkide/talkide/internal/worker/streamjson"
)

// This file offers MCP servers to the CLI (design open point 4):
//
//   - hosted servers run inside the worker and are reached over the CLI's
//     control protocol, as the Agent SDKs host theirs: the harness names them
//     in an initialize control request, the first line on the CLI's stdin,
//     and the CLI then sends every JSON-RPC message of the MCP session as a
//     control_request of subtype mcp_message, answered with
//     {"mcp_response": <JSON-RPC response>}. Claude Code 2.1.332 was checked
//     to accept this; it ignores sdkMcpServerManifests (it still does the
//     handshake), so none are sent. No port and no secret are involved.
//   - external servers (a project's .mcp.json, filtered by the operator's
//     policy) are passed with --mcp-config; the entries the policy refused
//     become mcp_server_refused events. --strict-mcp-config is always
//     passed, so the CLI starts no MCP server the harness did not name.
//
// Hosted handlers run on their own goroutines, never under the session's
// lock: a tool call may take seconds (it waits for the control plane) and
// must not stall the reading of the CLI's output.

// MCPProvider decides the MCP servers of a CLI process. Set Config.MCP; nil
// offers none.
type MCPProvider interface {
	// MCPServers is called before each CLI process of a conversation
	// starts, with the session's lock and a process slot held: it must not
	// block for long, and must not read the agent's files (the harness
	// passes the project's .mcp.json in MCPConversation).
	// An error fails the start of the process (and so the turn).
	MCPServers(c MCPConversation) (MCPSetup, error)
}

// MCPConversation identifies the process an MCPSetup is for.
type MCPConversation struct {
	ConversationID string
	UserID         string
	// WorkDir is the agent's working directory (where a .mcp.json lives).
	// Do not read files there: the agent owns it (see ProjectConfig).
	WorkDir string
	// ProjectConfig is the project's .mcp.json, nil when there is none. The
	// harness read it without following symlinks, as a regular file of the
	// agent's of at most mcppolicy.MaxFileBytes (package agentfs).
	ProjectConfig []byte
	// ProjectConfigRefused is set when a .mcp.json stands there but was
	// not read (a symlink in its path, not a regular file, another user's,
	// too large). Report it with a fixed message: its category is logged by
	// the harness, and nothing of the file may be shown.
	ProjectConfigRefused bool
	// AgentUser is the account the agent runs as (and owns WorkDir); nil:
	// the worker's own.
	AgentUser *sandbox.User
	// Emit appends an event to the conversation's event log (stored, then
	// streamed), as the harness's own events are. Safe to call from any
	// goroutine while the process lives; events after the conversation was
	// unloaded or deleted are dropped with a log line.
	Emit func(t contract.EventType, payload any)
}

// MCPSetup is the MCP configuration of one CLI process.
type MCPSetup struct {
	// Hosted are servers inside the worker, by server name (the CLI names
	// their tools mcp__<name>__<tool>).
	Hosted map[string]MCPHandler
	// Config is a --mcp-config document ({"mcpServers": {...}}) of
	// external servers; empty for none.
	Config json.RawMessage
	// Refused are servers the policy left out; each becomes an
	// mcp_server_refused event.
	Refused []contract.MCPServerRefused
	// Close, when set, is called once the process has ended.
	Close func()
}

// MCPHandler answers the JSON-RPC messages of one hosted server for one CLI
// process.
type MCPHandler interface {
	// HandleMCP handles one JSON-RPC message and returns the JSON-RPC
	// response, or nil for a notification. ctx ends when the process does,
	// and when the turn is interrupted (a long tool call, such as a build,
	// stops with it).
	HandleMCP(ctx context.Context, msg json.RawMessage) (json.RawMessage, error)
}

// mcpProcess is the MCP state of one process.
type mcpProcess struct {
	args []string
	// config is the --mcp-config document of external servers, or nil.
	config json.RawMessage
	hosted map[string]MCPHandler
	close  func()
	// initID is the request id of the initialize control request.
	initID string
	ctx    context.Context
	cancel context.CancelFunc

	mu sync.Mutex
	// calls cancels the hosted calls in flight, by control request id;
	// guarded by mu.
	calls map[string]context.CancelFunc
}

// begin registers a hosted call and returns its context; end it with done.
func (m *mcpProcess) begin(id string) context.Context {
	ctx, cancel := context.WithCancel(m.ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.calls == nil {
		m.calls = map[string]context.CancelFunc{}
	}
	m.calls[id] = cancel
	return ctx
}

func (m *mcpProcess) done(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.calls[id]; c != nil {
		c()
		delete(m.calls, id)
	}
}

// cancelCalls ends the contexts of the hosted calls in flight (the turn
// was interrupted).
func (m *mcpProcess) cancelCalls() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, c := range m.calls {
		c()
		delete(m.calls, id)
	}
}

// mcpLocked asks the provider for the MCP setup of a new process and
// reports refused servers. It returns a zero mcpProcess when no provider is
// set.
func (s *session) mcpLocked() (*mcpProcess, error) {
	// --strict-mcp-config: without it the CLI also starts the servers of the
	// project's .mcp.json (and the user's config) on its own, bypassing the
	// operator's policy; checked with Claude Code 2.1.332.
	m := &mcpProcess{args: []string{"--strict-mcp-config"}}
	if s.h.cfg.MCP == nil {
		return m, nil
	}
	f := s.filesLocked()
	setup, err := s.h.cfg.MCP.MCPServers(MCPConversation{ConversationID: s.conv, UserID: s.meta.UserID, WorkDir: s.workDir,
		ProjectConfig: f.mcpDoc, ProjectConfigRefused: f.mcpErr != nil, AgentUser: s.agentUser(),
		Emit: func(t contract.EventType, payload any) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.emitLocked(t, payload)
		}})
	if err != nil {
		return nil, fmt.Errorf("set up MCP servers: %w", err)
	}
	for _, r := range setup.Refused {
		s.h.log.Warn("mcp server refused by policy", "conversation", s.conv, "server", r.Server, "reason", r.Reason)
		s.emitLocked(contract.EventMCPServerRefused, r)
	}
	// The configuration (servers' headers and environment may hold
	// secrets) goes in a file, never in the command line that every
	// process of the host could read (case C5): see commandLocked.
	m.config = setup.Config
	m.hosted = setup.Hosted
	m.close = setup.Close
	return m, nil
}

// attach queues the initialize request naming the hosted servers as the
// process's first stdin line, and releases the setup once p ends. Call it
// after p started.
func (m *mcpProcess) attach(s *session, p *process) {
	p.mcp = m
	m.ctx, m.cancel = context.WithCancel(context.Background())
	s.h.procs.Go(func() {
		<-p.done
		m.cancel()
		if m.close != nil {
			m.close()
		}
	})
	ask := s.h.cfg.PermissionPolicy == PolicyAsk
	if len(m.hosted) == 0 && !ask {
		return
	}
	init := map[string]any{}
	if len(m.hosted) > 0 {
		names := make([]string, 0, len(m.hosted))
		for n := range m.hosted {
			names = append(names, n)
		}
		init["sdkMcpServers"] = names
	}
	if ask {
		// Every shell command is asked about (askHook), read-only ones too.
		init["hooks"] = map[string]any{"PreToolUse": []any{map[string]any{"matcher": askHookTools, "hookCallbackIds": []string{askHookID}}}}
	}
	m.initID = "initialize-" + uuid.NewString()
	p.send(streamjson.ControlRequestLine(m.initID, "initialize", init))
}

// release frees the setup of a process that did not start.
func (m *mcpProcess) release() {
	if m.close != nil {
		m.close()
	}
}

// mcpControlLocked handles a control request of subtype mcp_message; it
// reports false for any other request.
func (s *session) mcpControlLocked(p *process, m *streamjson.ControlRequest) bool {
	if m.Subtype() != "mcp_message" {
		return false
	}
	var req struct {
		ServerName string          `json:"server_name"`
		Message    json.RawMessage `json:"message"`
	}
	_ = json.Unmarshal(m.Request, &req)
	var h MCPHandler
	if p.mcp != nil {
		h = p.mcp.hosted[req.ServerName]
	}
	if h == nil || len(req.Message) == 0 {
		p.send(streamjson.ControlError(m.RequestID, "no MCP server "+req.ServerName+" is hosted here"))
		return true
	}
	id := m.RequestID
	ctx := p.mcp.begin(id)
	s.h.procs.Go(func() {
		defer p.mcp.done(id)
		resp, err := h.HandleMCP(ctx, req.Message)
		switch {
		case err != nil:
			p.send(streamjson.ControlError(id, err.Error()))
		case resp == nil: // a notification: the CLI still awaits an answer
			p.send(streamjson.ControlSuccess(id, map[string]any{"mcp_response": map[string]any{"jsonrpc": "2.0", "result": map[string]any{}}}))
		default:
			p.send(streamjson.ControlSuccess(id, map[string]any{"mcp_response": resp}))
		}
	})
	return true
}

// controlResponseLocked logs a failed answer to a control request the
// harness sent (the initialize request).
func (s *session) controlResponseLocked(m *streamjson.ControlResponse) {
	if m.Response.Subtype == "error" {
		s.h.log.Warn("claude code refused a control request", "conversation", s.conv, "request_id", m.Response.RequestID, "err", m.Response.Error)
	}
}
