// Package issuemcp is the talkide-issue-tracking MCP server, built with the
// official MCP Go SDK and offered to every Claude Code session of the
// worker. Its tools file, list, read, update and comment on the issues of
// the worker's tenant-env: create_issue, list_issues, get_issue,
// update_issue and comment_issue (the CLI names them
// mcp__talkide-issue-tracking__<tool>).
//
// The server runs inside the worker and is reached over the CLI's control
// protocol (see harness/mcp.go), through package mcphost: no port or
// secret exists.
//
// Writes go through the worker's outbox like every report: stored durably
// first, then delivered with an idempotency key. A tool waits a little for
// the control plane's answer; if the control plane is unreachable the tool
// result says the write is queued and will be delivered later. Reads ask the
// control plane directly and fail with a clear message while it is down.
//
// Main type: Server (the tools over a Queue and a Reader). It does not
// talk HTTP itself (package reportclient does).
package issuemcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/mcphost"
	"github.com/talkide/talkide/internal/worker/outbox"
	"github.com/talkide/talkide/internal/worker/reportclient"
)

// ServerName is the MCP server's name; the CLI prefixes its tools with
// mcp__talkide-issue-tracking__.
const ServerName = "talkide-issue-tracking"

// Queue stores writes durably and tells when they were delivered (the
// outbox).
type Queue interface {
	Put(conv, method, path, key string, body []byte) (int64, error)
	Wait(ctx context.Context, conv string, seq int64) (outbox.Result, bool)
}

// Reader reads issues from the control plane (the report client).
type Reader interface {
	ListIssues(ctx context.Context, conv, state string, limit int) (contract.IssueList, error)
	GetIssue(ctx context.Context, conv string, number int64) (contract.Issue, error)
}

var (
	_ Queue  = (*outbox.Outbox)(nil)
	_ Reader = (*reportclient.Client)(nil)
)

// Config configures a Server.
type Config struct {
	Queue  Queue
	Reader Reader
	// DeliveryWait is how long a write tool waits for the control plane's
	// answer before it reports the write as queued. Default 10 s.
	DeliveryWait time.Duration
	Logger       *slog.Logger
}

// Server makes the MCP server of one conversation.
type Server struct {
	cfg Config
}

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.DeliveryWait <= 0 {
		cfg.DeliveryWait = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{cfg: cfg}
}

// Input types; the SDK infers the tools' JSON schemas from them and
// validates every call against the schema before the handler runs.
type (
	createInput struct {
		Title string `json:"title" jsonschema:"one-line summary of the issue, 1-200 characters"`
		Body  string `json:"body,omitempty" jsonschema:"details in Markdown: what happened, how to reproduce, what was expected (optional, at most 32 KiB)"`
	}
	listInput struct {
		State string `json:"state,omitempty" jsonschema:"which issues: open, closed or all (default open)"`
		Limit int    `json:"limit,omitempty" jsonschema:"at most this many issues, newest first, 1-100 (default 20)"`
	}
	getInput struct {
		Number int64 `json:"number" jsonschema:"the issue number"`
	}
	updateInput struct {
		Number int64   `json:"number" jsonschema:"the issue number"`
		Title  *string `json:"title,omitempty" jsonschema:"new one-line title"`
		Body   *string `json:"body,omitempty" jsonschema:"new body in Markdown (replaces the old one)"`
		State  *string `json:"state,omitempty" jsonschema:"open or closed"`
	}
	commentInput struct {
		Number int64  `json:"number" jsonschema:"the issue number"`
		Body   string `json:"body" jsonschema:"the comment in Markdown"`
	}
)

// session is one conversation's binding of the tools.
type session struct {
	*Server
	conv string
}

// mcpServer builds the SDK server for conversation conv.
func (s *Server) mcpServer(conv string) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: ServerName, Title: "TalkIDE issue tracking", Version: "1"}, &mcp.ServerOptions{
		Instructions: "Issues of this project's TalkIDE environment. File an issue for a bug, a missing feature or follow-up work you cannot do now; " +
			"look at existing issues (list_issues) before filing a duplicate.",
		Logger: s.cfg.Logger,
	})
	ss := &session{Server: s, conv: conv}
	mcp.AddTool(srv, &mcp.Tool{Name: "create_issue", Title: "Create issue",
		Description: "File a new issue in this project's issue tracker. Returns the issue number, or says that the issue was queued when the tracker is unreachable (it is filed automatically later)."}, ss.create)
	mcp.AddTool(srv, &mcp.Tool{Name: "list_issues", Title: "List issues",
		Description: "List the project's issues, newest first.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, ss.list)
	mcp.AddTool(srv, &mcp.Tool{Name: "get_issue", Title: "Get issue",
		Description: "Read one issue with its comments.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, ss.get)
	mcp.AddTool(srv, &mcp.Tool{Name: "update_issue", Title: "Update issue",
		Description: "Change an issue's title, body or state (open or closed). Give only what changes."}, ss.update)
	mcp.AddTool(srv, &mcp.Tool{Name: "comment_issue", Title: "Comment on issue",
		Description: "Add a comment to an issue."}, ss.comment)
	return srv
}

func text(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}}
}

// toolError is a tool result with isError set: the model sees the message.
func toolError(format string, args ...any) *mcp.CallToolResult {
	r := text(format, args...)
	r.IsError = true
	return r
}

// invalid turns a contract validation error into a tool error message.
func invalid(err error) *mcp.CallToolResult {
	return toolError("Invalid arguments: %s.", strings.TrimPrefix(err.Error(), contract.ErrInvalidReport.Error()+": "))
}

// write queues one issue write and waits a little for the control plane's
// answer. done formats the answer; queued is the text when it does not come
// in time.
func (s *session) write(ctx context.Context, path, key string, body any, done func(contract.IssueAck) *mcp.CallToolResult, queued string) *mcp.CallToolResult {
	b, err := json.Marshal(body)
	if err != nil {
		return toolError("Internal error: %v.", err)
	}
	seq, err := s.cfg.Queue.Put(s.conv, "POST", path, key, b)
	if errors.Is(err, outbox.ErrFull) {
		return toolError("The issue tracker has too much undelivered work queued; nothing was recorded. Try again later.")
	}
	if err != nil {
		s.cfg.Logger.Error("queue issue write", "conversation", s.conv, "err", err)
		return toolError("The issue tracker could not record this: %v.", err)
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.DeliveryWait)
	defer cancel()
	r, ok := s.cfg.Queue.Wait(wctx, s.conv, seq)
	switch {
	case ok && r.Delivered:
		var ack contract.IssueAck
		if err := json.Unmarshal(r.Body, &ack); err != nil {
			return text("%s (the tracker's answer could not be read: %v)", queued, err)
		}
		return done(ack)
	case ok:
		var pe *outbox.PermanentError
		if errors.As(r.Err, &pe) && pe.Status == 404 {
			return toolError("No such issue in this project.")
		}
		return toolError("The issue tracker refused this: %v.", r.Err)
	default:
		return text("%s", queued)
	}
}

func (s *session) create(ctx context.Context, _ *mcp.CallToolRequest, in createInput) (*mcp.CallToolResult, any, error) {
	c := contract.IssueCreate{IdempotencyKey: s.conv + ":mcp:" + uuid.NewString(), Title: in.Title, Body: in.Body}
	if err := c.Validate(); err != nil {
		return invalid(err), nil, nil
	}
	return s.write(ctx, contract.PathReportIssues, c.IdempotencyKey, c, func(a contract.IssueAck) *mcp.CallToolResult {
		return text("Created issue #%d: %s", a.Issue.Number, a.Issue.Title)
	}, fmt.Sprintf("The issue tracker is unreachable right now. The issue %q was queued and will be filed automatically when the tracker is back; "+
		"its number is not known yet. Do not file it again.", c.Title)), nil, nil
}

func (s *session) update(ctx context.Context, _ *mcp.CallToolRequest, in updateInput) (*mcp.CallToolResult, any, error) {
	if in.Number < 1 {
		return toolError("Invalid arguments: number must be an issue number (1 or more)."), nil, nil
	}
	u := contract.IssueUpdate{IdempotencyKey: s.conv + ":mcp:" + uuid.NewString(), Title: in.Title, Body: in.Body, State: in.State}
	if err := u.Validate(); err != nil {
		return invalid(err), nil, nil
	}
	path := reportclient.IssuePath(contract.PathReportIssueUpdate, in.Number)
	return s.write(ctx, path, u.IdempotencyKey, u, func(a contract.IssueAck) *mcp.CallToolResult {
		return text("Updated issue #%d (%s): %s", a.Issue.Number, a.Issue.State, a.Issue.Title)
	}, fmt.Sprintf("The issue tracker is unreachable right now. The update of issue #%d was queued and will be applied automatically when the tracker is back.", in.Number)), nil, nil
}

func (s *session) comment(ctx context.Context, _ *mcp.CallToolRequest, in commentInput) (*mcp.CallToolResult, any, error) {
	if in.Number < 1 {
		return toolError("Invalid arguments: number must be an issue number (1 or more)."), nil, nil
	}
	c := contract.IssueComment{IdempotencyKey: s.conv + ":mcp:" + uuid.NewString(), Body: in.Body}
	if err := c.Validate(); err != nil {
		return invalid(err), nil, nil
	}
	path := reportclient.IssuePath(contract.PathReportIssueComment, in.Number)
	return s.write(ctx, path, c.IdempotencyKey, c, func(a contract.IssueAck) *mcp.CallToolResult {
		return text("Commented on issue #%d: %s", a.Issue.Number, a.Issue.Title)
	}, fmt.Sprintf("The issue tracker is unreachable right now. The comment on issue #%d was queued and will be added automatically when the tracker is back.", in.Number)), nil, nil
}

// readError explains a failed read to the model.
func readError(err error) *mcp.CallToolResult {
	var se *reportclient.StatusError
	if errors.As(err, &se) && se.Status == 404 {
		return toolError("No such issue in this project.")
	}
	return toolError("The issue tracker is unreachable right now (%v). Try again later.", err)
}

func (s *session) list(ctx context.Context, _ *mcp.CallToolRequest, in listInput) (*mcp.CallToolResult, any, error) {
	state := in.State
	switch state {
	case "":
		state = contract.IssueOpen
	case contract.IssueOpen, contract.IssueClosed, "all":
	default:
		return toolError("Invalid arguments: state must be open, closed or all."), nil, nil
	}
	limit := in.Limit
	if limit == 0 {
		limit = 20
	}
	if limit < 1 || limit > 100 {
		return toolError("Invalid arguments: limit must be 1-100."), nil, nil
	}
	l, err := s.cfg.Reader.ListIssues(ctx, s.conv, state, limit)
	if err != nil {
		return readError(err), nil, nil
	}
	if len(l.Issues) == 0 {
		return text("No %s issues.", state), nil, nil
	}
	var b strings.Builder
	for _, is := range l.Issues {
		fmt.Fprintf(&b, "#%d [%s] %s\n", is.Number, is.State, is.Title)
	}
	return text("%s", strings.TrimRight(b.String(), "\n")), nil, nil
}

func (s *session) get(ctx context.Context, _ *mcp.CallToolRequest, in getInput) (*mcp.CallToolResult, any, error) {
	if in.Number < 1 {
		return toolError("Invalid arguments: number must be an issue number (1 or more)."), nil, nil
	}
	is, err := s.cfg.Reader.GetIssue(ctx, s.conv, in.Number)
	if err != nil {
		return readError(err), nil, nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "#%d [%s] %s\nfiled %s\n", is.Number, is.State, is.Title, is.CreatedAt.Format(time.RFC3339))
	if is.Body != "" {
		fmt.Fprintf(&b, "\n%s\n", is.Body)
	}
	for _, c := range is.Comments {
		fmt.Fprintf(&b, "\ncomment %d (%s):\n%s\n", c.Seq, c.CreatedAt.Format(time.RFC3339), c.Body)
	}
	return text("%s", strings.TrimRight(b.String(), "\n")), nil, nil
}

// Open starts an MCP server session for conversation conv. Close it when
// the CLI process ends.
func (s *Server) Open(conv string) (*mcphost.Handler, error) {
	return mcphost.Open(s.mcpServer(conv))
}
