package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"
)

// Header names.
const (
	// HeaderWorkerToken carries a request token (control plane → worker) or a
	// WorkerToken (worker → gateway-proxy and reporting endpoints).
	HeaderWorkerToken = "X-Worker-Token"
	// HeaderLastEventID is the SSE resume header (WHATWG HTML, server-sent events).
	HeaderLastEventID = "Last-Event-ID"
)

// Worker HTTP API paths, relative to the worker's base URL. {id} is a
// conversation id (see ValidConversationID).
const (
	PathSession    = "/v1/conversations/{id}/session"                  // POST CreateSessionRequest → 200 SessionStatus
	PathMessages   = "/v1/conversations/{id}/messages"                 // POST SendMessageRequest → 202 SendMessageResponse
	PathInterrupt  = "/v1/conversations/{id}/interrupt"                // POST → 202 InterruptResponse
	PathStop       = "/v1/conversations/{id}/stop"                     // POST → 200 SessionStatus
	PathStatus     = "/v1/conversations/{id}"                          // GET → 200 SessionStatus; DELETE → 200 SessionDeleted
	PathEvents     = "/v1/conversations/{id}/events"                   // GET → text/event-stream of Event
	PathPermission = "/v1/conversations/{id}/permissions/{request_id}" // POST PermissionAnswer → 200 PermissionResolved
	// PathWorker describes the worker: the replica that answered and the
	// agent-containment guarantees its host gives.
	PathWorker = "/v1/worker" // GET → 200 WorkerInfo
)

// Control-plane paths the worker calls.
const (
	// PathMint is the mint endpoint: Authorization: Bearer <identity token>,
	// body MintRequest, answer MintResponse.
	PathMint = "/api/v1/worker-gateway/token/mint"
	// PathGatewayPrefix is the gateway-proxy prefix; the rest of the path
	// is forwarded to the Anthropic-compatible upstream (e.g. /v1/messages).
	PathGatewayPrefix = "/api/internal/gateway/anthropic"
	// PathGatewayMessages and PathGatewayCountTokens are the only API paths
	// (after PathGatewayPrefix) the gateway-proxy forwards, and so the only
	// ones the worker's local proxy sends on; see GatewayForwards.
	PathGatewayMessages    = "/v1/messages"
	PathGatewayCountTokens = "/v1/messages/count_tokens"
	// PathReportPrefix is the prefix of the worker reporting endpoints.
	PathReportPrefix = "/api/internal/worker"
)

// GatewayForwards reports whether the gateway-proxy forwards API path p
// (the part after PathGatewayPrefix, e.g. "/v1/messages").
func GatewayForwards(p string) bool {
	return p == PathGatewayMessages || p == PathGatewayCountTokens
}

// Codes the gateway-proxy puts in error.details.error_code of its
// Anthropic error envelope, for clients that talk to it directly with an
// Anthropic SDK (docs/direct-sdk.md) and for the worker's local proxy.
const (
	// ErrCodeTokenExpired: 401 authentication_error, x-should-retry
	// false. The WorkerToken is expired (or not yet valid: clock skew).
	// The same request with the same token fails again; mint a new token
	// and send it with that. The local proxy, which mints per request,
	// tells the CLI to retry.
	ErrCodeTokenExpired = "worker_token_expired"
	// ErrCodeBudgetExceeded: 429 rate_limit_error, x-should-retry false,
	// retry-after the seconds until the budget period resets, and a
	// message that starts with "TalkIDE budget exhausted:".
	ErrCodeBudgetExceeded = "budget_exceeded"
	// ErrCodeFairUse: 429 rate_limit_error with retry-after (seconds): a
	// transient limit; retry after it.
	ErrCodeFairUse = "fair_use_limit"
)

var conversationIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// ErrInvalidConversationID is returned by ValidConversationID.
var ErrInvalidConversationID = errors.New("invalid conversation id")

// ValidConversationID checks that id is 1–64 characters of [A-Za-z0-9_-],
// not starting with '_' or '-'. Conversation ids appear in paths and file
// names, so nothing else is accepted.
func ValidConversationID(id string) error {
	if !conversationIDRe.MatchString(id) {
		return fmt.Errorf("%w: %q", ErrInvalidConversationID, id)
	}
	return nil
}

// ErrorBody is the JSON body of every error answer of the browser API, the
// worker API, the mint endpoint and the reporting endpoints:
//
//	{"error":{"type":"not_found","message":"conversation not found"}}
//
// The gateway-proxy answers in Anthropic's error envelope instead, because
// Anthropic clients parse that.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of ErrorBody. Type is one of the ErrorType
// constants; Message is safe to show to a user.
type ErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	// RequestID is the id of the request that failed (also in the
	// X-Request-Id header): it finds the request's lines in the logs of
	// every TalkIDE process it crossed.
	RequestID string `json:"request_id,omitempty"`
}

// Error types used in ErrorDetail.Type, with the HTTP status they go with.
const (
	ErrTypeInvalidRequest = "invalid_request"    // 400
	ErrTypeUnauthorized   = "unauthorized"       // 401
	ErrTypeForbidden      = "forbidden"          // 403
	ErrTypeNotFound       = "not_found"          // 404
	ErrTypeMethod         = "method_not_allowed" // 405
	ErrTypeConflict       = "conflict"           // 409
	ErrTypeTooLarge       = "request_too_large"  // 413
	ErrTypeUnsupported    = "unsupported_media"  // 415
	ErrTypeRateLimited    = "rate_limited"       // 429
	ErrTypeInternal       = "internal_error"     // 500
	ErrTypeUnavailable    = "unavailable"        // 503
	ErrTypeUpstream       = "upstream_error"     // 502
	ErrTypeTimeout        = "timeout"            // 504
)

// CreateSessionRequest creates a conversation's session on the worker, or
// returns the existing one (idempotent).
type CreateSessionRequest struct {
	// UserID is the platform user the conversation belongs to.
	UserID string `json:"user_id"`
	// Model optionally selects the model (a Claude Code --model value);
	// empty means the worker's default.
	Model string `json:"model,omitempty"`
	// Sample optionally names a sample project the new conversation's
	// working tree starts from (e.g. "java-calculator"); ignored when the
	// session exists already. An unknown name is 400 invalid_request.
	Sample string `json:"sample,omitempty"`
}

// SessionState is the state of a conversation's session on the worker.
type SessionState string

const (
	// StateIdle: no turn runs; a CLI process may or may not be alive.
	StateIdle SessionState = "idle"
	// StateRunning: a turn runs.
	StateRunning SessionState = "running"
	// StateStopped: the session was stopped by a Stop command; a new message
	// starts it again.
	StateStopped SessionState = "stopped"
)

// SessionStatus describes a conversation's session on the worker.
type SessionStatus struct {
	ConversationID string       `json:"conversation_id"`
	UserID         string       `json:"user_id"`
	State          SessionState `json:"state"`
	// SessionID is the Claude Code session id (a UUID), the name of the
	// transcript file under CLAUDE_CONFIG_DIR/projects.
	SessionID string `json:"session_id"`
	// WorkDir is the absolute working directory of the agent, under the
	// worker's current workspace root; empty when the worker refused the
	// conversation's stored state (it names a directory outside the root).
	WorkDir string `json:"work_dir"`
	// ProcessRunning is true while a CLI process is alive for the session.
	ProcessRunning bool `json:"process_running"`
	// QueuedMessages is the number of accepted messages whose turn has not started.
	QueuedMessages int `json:"queued_messages"`
	// LastEventID is the id of the newest event in the conversation's stream (0: none).
	LastEventID int64 `json:"last_event_id"`
}

// SendMessageRequest sends a user message to a conversation.
type SendMessageRequest struct {
	// ClientMessageID is chosen by the sender (1–64 characters of
	// [A-Za-z0-9_-]); a retried send with the same id is accepted again
	// without running twice.
	ClientMessageID string `json:"client_message_id"`
	// UserID is the platform user sending the message; it must match the
	// session's user when the session exists.
	UserID string `json:"user_id"`
	// Text is the message, 1 byte to MaxMessageBytes.
	Text string `json:"text"`
}

// MaxMessageBytes bounds SendMessageRequest.Text (256 KiB).
const MaxMessageBytes = 256 << 10

// SendMessageResponse answers SendMessageRequest with 202 Accepted.
type SendMessageResponse struct {
	ClientMessageID string `json:"client_message_id"`
	// Duplicate is true when the id had been accepted before; nothing new runs.
	Duplicate bool `json:"duplicate"`
}

// InterruptResponse answers an interrupt with 202 Accepted.
type InterruptResponse struct {
	// Interrupted is true when a running turn was asked to stop; false when
	// no turn was running (nothing to interrupt).
	Interrupted bool `json:"interrupted"`
}

// SessionDeleted answers DELETE PathStatus: the conversation is gone from
// the worker (its process stopped, its files, state and events removed).
type SessionDeleted struct {
	ConversationID string `json:"conversation_id"`
	// AgentUIDReleased is true when the conversation's agent had a user id
	// of its own, now released (its processes ended, its files removed).
	AgentUIDReleased bool `json:"agent_uid_released"`
}

// EventType names an event; it is the SSE "event:" field.
type EventType string

// Event types. Each has a payload type below; the table in
// docs/worker-api.md lists them.
const (
	EventSessionStarted EventType = "session_started"
	EventUserMessage    EventType = "user_message"
	EventTurnStarted    EventType = "turn_started"
	EventAssistantText  EventType = "assistant_text"
	EventToolUse        EventType = "tool_use"
	EventToolResult     EventType = "tool_result"
	EventAPIRetry       EventType = "api_retry"
	EventTurnCompleted  EventType = "turn_completed"
	EventTurnFailed     EventType = "turn_failed"
	EventError          EventType = "error"
	EventSessionStopped EventType = "session_stopped"
	EventTurnQueued     EventType = "turn_queued"
	// EventPermissionRequested and EventPermissionResolved carry the agent's
	// requests to use a tool when the worker's permission policy is "ask".
	EventPermissionRequested EventType = "permission_requested"
	EventPermissionResolved  EventType = "permission_resolved"
	// EventMCPServerRefused: an MCP server of the project's .mcp.json was
	// not offered to the agent because the operator's policy refuses it.
	EventMCPServerRefused EventType = "mcp_server_refused"
	// EventLimitReached: the conversation's agent hit one of its limits
	// (memory, processes, disk); the worker and other conversations go on.
	EventLimitReached EventType = "limit_reached"
	// EventBuildStarted, EventBuildProgress and EventBuildCompleted follow
	// a build the agent started with its build tool (talkide-build): a
	// Kubernetes Job or, on one machine, a contained local process.
	EventBuildStarted   EventType = "build_started"
	EventBuildProgress  EventType = "build_progress"
	EventBuildCompleted EventType = "build_completed"
)

// Event is one entry of a conversation's event stream. On the wire it is one
// server-sent event: "id: <ID>", "event: <Type>", "data: <Event as JSON>".
// IDs are a per-conversation sequence starting at 1, increasing by 1; an event
// is stored durably before it is streamed.
type Event struct {
	ID             int64           `json:"id"`
	Type           EventType       `json:"type"`
	ConversationID string          `json:"conversation_id"`
	Time           time.Time       `json:"time"`
	Data           json.RawMessage `json:"data"`
}

// NewEvent builds an event of type t with payload p (marshalled to JSON);
// the ID is assigned when the event is appended to a log.
func NewEvent(conversationID string, t EventType, p any) (Event, error) {
	data, err := json.Marshal(p)
	if err != nil {
		return Event{}, fmt.Errorf("marshal %s payload: %w", t, err)
	}
	return Event{Type: t, ConversationID: conversationID, Time: time.Now().UTC(), Data: data}, nil
}

// SessionStarted: a CLI process started (or was resumed) for the conversation.
type SessionStarted struct {
	SessionID         string `json:"session_id"`
	Model             string `json:"model"`
	WorkDir           string `json:"work_dir"`
	Resumed           bool   `json:"resumed"`
	ClaudeCodeVersion string `json:"claude_code_version"`
}

// UserMessage: a user message was accepted into the conversation.
type UserMessage struct {
	ClientMessageID string `json:"client_message_id"`
	Text            string `json:"text"`
}

// TurnStarted: the CLI started working on a user message.
type TurnStarted struct {
	ClientMessageID string `json:"client_message_id"`
	// Continued is set when the turn goes on after a worker restart cut it
	// while a permission request was pending (the request is raised again).
	Continued bool `json:"continued,omitempty"`
}

// AssistantText: a text block the model produced.
type AssistantText struct {
	// MessageID is the Anthropic message id the block belongs to.
	MessageID string `json:"message_id"`
	Text      string `json:"text"`
}

// ToolUse: the model called a tool. Calls a sub-agent makes (the agent the
// CLI's Agent tool, "Task" in its tool list, starts) are events too, with
// ParentToolUseID set.
type ToolUse struct {
	ToolUseID string          `json:"tool_use_id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	// ParentToolUseID is the tool_use_id of the Agent call whose sub-agent
	// made this call; empty (absent in JSON) for the main agent's calls.
	ParentToolUseID string `json:"parent_tool_use_id,omitempty"`
}

// ToolResult: a tool call finished.
type ToolResult struct {
	ToolUseID string `json:"tool_use_id"`
	// Content is the tool's output as text (text blocks joined by newlines).
	Content string `json:"content"`
	IsError bool   `json:"is_error"`
	// ParentToolUseID is as on ToolUse: set for a sub-agent's call.
	ParentToolUseID string `json:"parent_tool_use_id,omitempty"`
}

// APIRetry: the CLI is retrying a failed Anthropic API call.
type APIRetry struct {
	Attempt    int `json:"attempt"`
	MaxRetries int `json:"max_retries"`
	// RetryDelayMS is the wait before the retry, in milliseconds.
	RetryDelayMS int64 `json:"retry_delay_ms"`
	// ErrorStatus is the HTTP status of the failed call; 0 when there was
	// none (connection cut, timeout).
	ErrorStatus int `json:"error_status"`
	// Error is the CLI's error class, e.g. "rate_limit", "server_error".
	Error string `json:"error"`
}

// Usage counts the tokens of a turn, by kind (Anthropic usage fields).
type Usage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

// TurnCompleted: the turn ended normally.
type TurnCompleted struct {
	ClientMessageID string `json:"client_message_id"`
	// Result is the final assistant text of the turn.
	Result string `json:"result"`
	Usage  Usage  `json:"usage"`
	// CostNanoUSD is the turn's cost in billionths of a US dollar as the
	// Claude Code CLI computes it at list price; the gateway's ledger is
	// authoritative for billing.
	CostNanoUSD int64 `json:"cost_nano_usd"`
	// DurationMS is the turn's wall time in milliseconds.
	DurationMS int64 `json:"duration_ms"`
	// NumTurns is the number of model calls of the turn.
	NumTurns   int    `json:"num_turns"`
	StopReason string `json:"stop_reason"`
	// RequestIDs are the upstream's request ids of the turn's model calls
	// (main agent and sub-agents, each once, in order; at most
	// MaxTurnRequestIDs): what the gateway booked for each is listed by
	// the browser API's GET /api/conversations/{id}/calls.
	RequestIDs []string `json:"request_ids,omitempty"`
}

// MaxTurnRequestIDs bounds TurnCompleted.RequestIDs and
// TurnFailed.RequestIDs; a turn with more calls names its first ones.
const MaxTurnRequestIDs = 200

// Reasons of TurnFailed.
const (
	FailAPIError      = "api_error"      // the Anthropic API (or the gateway) refused or failed for good
	FailInterrupted   = "interrupted"    // an interrupt stopped the turn
	FailMaxTurns      = "max_turns"      // the turn hit its model-call limit
	FailProcessExited = "process_exited" // the CLI process ended without finishing the turn
	FailStartFailed   = "start_failed"   // the CLI process could not be started
	FailExecution     = "execution_error"
	// FailWorkerRestarted: the worker stopped (crash, kill) during the turn;
	// the turn is not run again by itself.
	FailWorkerRestarted = "worker_restarted"
)

// TurnFailed: the turn ended without completing.
type TurnFailed struct {
	ClientMessageID string `json:"client_message_id"`
	// Reason is one of the Fail* constants.
	Reason string `json:"reason"`
	// Message is a human-readable explanation (for an API error, the CLI's
	// "API Error: ..." text).
	Message string `json:"message"`
	// APIErrorStatus is the HTTP status of a final API error, else 0.
	APIErrorStatus int   `json:"api_error_status,omitempty"`
	Usage          Usage `json:"usage"`
	// RequestIDs are as TurnCompleted's: the calls made before it failed.
	RequestIDs []string `json:"request_ids,omitempty"`
}

// ErrorEvent: something went wrong outside a turn's normal failure path.
type ErrorEvent struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// PermissionRequested: the agent asks to use a tool (permission policy
// "ask"); answer with PermissionAnswer at PathPermission before ExpiresAt,
// else it is denied. After a worker restart a pending request is raised again
// with the same RequestID and Reraised set.
type PermissionRequested struct {
	RequestID string          `json:"request_id"`
	ToolName  string          `json:"tool_name"`
	ToolUseID string          `json:"tool_use_id"`
	Input     json.RawMessage `json:"input"`
	// Description is the CLI's short description of the call, if any.
	Description string    `json:"description,omitempty"`
	ExpiresAt   time.Time `json:"expires_at"`
	Reraised    bool      `json:"reraised,omitempty"`
}

// PermissionAnswer answers a PermissionRequested.
type PermissionAnswer struct {
	// Behavior is "allow" or "deny".
	Behavior string `json:"behavior"`
	// Message is told to the agent on "deny" (optional).
	Message string `json:"message,omitempty"`
}

// PermissionResolved: a permission request was answered, timed out or
// dropped.
type PermissionResolved struct {
	RequestID string `json:"request_id"`
	// Behavior is "allow" or "deny".
	Behavior string `json:"behavior"`
	// Reason: "answered", "timeout" (nobody answered in time), "turn_ended"
	// (the turn ended first: interrupted, stopped, failed).
	Reason string `json:"reason"`
}

// TurnQueued: the message's turn waits for a free agent process (the
// worker caps how many run at once); it starts when one frees up.
type TurnQueued struct {
	ClientMessageID string `json:"client_message_id"`
	// Position is the conversation's 1-based place in the worker's queue.
	Position int `json:"position"`
	// LiveProcesses and MaxProcesses are the worker's agent processes now
	// and its cap.
	LiveProcesses int `json:"live_processes"`
	MaxProcesses  int `json:"max_processes"`
}

// SessionStopped: the CLI process of the conversation ended.
type SessionStopped struct {
	// Reason: "stopped" (Stop command), "idle" (idle timeout), "evicted"
	// (stopped to make room for a waiting turn), "exited" (the process ended
	// on its own), "shutdown" (worker shutdown), "interrupt_timeout" (an
	// interrupted turn did not end in time).
	Reason   string `json:"reason"`
	ExitCode int    `json:"exit_code"`
}

// Limits an agent can reach (LimitReached.Limit).
const (
	LimitMemory    = "memory"
	LimitProcesses = "processes"
	LimitDisk      = "disk"
	LimitFiles     = "files"
)

// LimitReached: the conversation's agent hit a limit. For memory the kernel
// ended its largest process (often the command that used the memory, or
// the agent's CLI itself, which then fails the turn and is started again on
// the next message); for processes a fork was refused; for disk and files
// the running turn was stopped (a turn that starts over the limit gets the
// event at its start and may only free space: it is stopped if the files
// grow).
type LimitReached struct {
	// Limit is "memory", "processes", "disk" or "files".
	Limit string `json:"limit"`
	// Max is the limit: bytes for memory and disk, a count for processes
	// and files.
	Max int64 `json:"max"`
	// Used is the use seen when the limit was hit: bytes for disk, files
	// (names, a hard link each, at least: counting stops past the limit) for files, and for
	// memory where no cgroup counts it (the agent's resident bytes, or the
	// worker's when its own memory ran short); else the number of hits
	// since the agent started.
	Used int64 `json:"used"`
	// Message says what happened and what the user can do.
	Message string `json:"message"`
}

// BuildStarted: the agent's build tool started a build (it may wait in
// the queue first: see BuildProgress).
type BuildStarted struct {
	// BuildID is the build's id within the conversation: the tool_use_id of
	// the call that started it, when the CLI names it.
	BuildID string `json:"build_id"`
	// Runner is "kubernetes" (a Job in the tenant-env's namespace) or
	// "local" (a contained process on the worker's machine).
	Runner string   `json:"runner"`
	Tasks  []string `json:"tasks"`
	Tests  string   `json:"tests,omitempty"`
}

// Build states of BuildProgress.
const (
	BuildQueued  = "queued"
	BuildRunning = "running"
)

// BuildProgress: a build's state changed, or it logged lines. Lines are
// batched (at most MaxBuildLinesPerEvent lines and MaxBuildEventBytes per
// event, at most about one event a second), each cut at
// MaxBuildLineBytes; a build's events carry at most MaxBuildLogLines lines
// and MaxBuildLogBytes in all, after which Truncated is set once and the
// rest is only in the log tail of BuildCompleted.
type BuildProgress struct {
	BuildID string `json:"build_id"`
	// State is "queued" or "running"; empty when only lines came.
	State string `json:"state,omitempty"`
	// QueuePlace is the place in the tenant-env's build queue (1: next)
	// while queued.
	QueuePlace int `json:"queue_place,omitempty"`
	// PodPhase is the build pod's phase (Kubernetes only).
	PodPhase  string   `json:"pod_phase,omitempty"`
	Lines     []string `json:"lines,omitempty"`
	Truncated bool     `json:"truncated,omitempty"`
	// Resumed is set when a restarted worker follows the build again (the
	// build_completed that follows carries Recovered).
	Resumed bool `json:"resumed,omitempty"`
}

// Bounds of the log lines build events carry: lines per event and per
// build, bytes of one line (a longer one is cut), of one event's lines
// and of a build's lines in all.
const (
	MaxBuildLinesPerEvent = 200
	MaxBuildLogLines      = 5000
	MaxBuildLineBytes     = 2 << 10
	MaxBuildEventBytes    = 64 << 10
	MaxBuildLogBytes      = 1 << 20
)

// BuildCompleted: a build ended. Phase is "succeeded", "failed" or
// "cancelled"; Reason is one CamelCase word (ExitCode, DeadlineExceeded,
// Unschedulable, ImagePullBackOff, Cancelled, WorkerRestarted, …).
type BuildCompleted struct {
	BuildID string `json:"build_id"`
	Runner  string `json:"runner"`
	Phase   string `json:"phase"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// ExitCode is the build command's exit status, -1 when not known.
	ExitCode int `json:"exit_code"`
	// Tests, Failures, Errors and Skipped count the test cases of the
	// JUnit reports the build wrote.
	Tests    int `json:"tests"`
	Failures int `json:"failures"`
	Errors   int `json:"errors"`
	Skipped  int `json:"skipped"`
	// Failed are the failed and erroneous test cases (at most 50).
	Failed []BuildTestFailure `json:"failed,omitempty"`
	// LogTail is the last lines of the build's log (at most 40).
	LogTail []string `json:"log_tail,omitempty"`
	// ReportsTruncated says, one note each (at most 17), where the test
	// reports were not read whole: a cap on what the worker keeps, or a
	// report it stopped reading (too deep, too large a tag); the counts
	// are of what was read.
	ReportsTruncated []string `json:"reports_truncated,omitempty"`
	// DurationMS is the build's wall time in milliseconds, queue included.
	DurationMS int64 `json:"duration_ms"`
	// Recovered is set when the result was delivered by a worker that
	// restarted while the build ran (the tool call that started it had
	// ended with the old worker).
	Recovered bool `json:"recovered,omitempty"`
}

// BuildTestFailure is one failed test case of a build.
type BuildTestFailure struct {
	Class   string `json:"class"`
	Name    string `json:"name"`
	Status  string `json:"status"` // "failed" (an assertion) or "error" (it threw)
	Type    string `json:"type,omitempty"`
	Message string `json:"message,omitempty"`
	// Detail is the start of the stack trace (at most 8 KiB).
	Detail string `json:"detail,omitempty"`
}

// MCPServerRefused: an MCP server declared by the project's .mcp.json was
// left out of the agent's session by the operator's MCP policy.
type MCPServerRefused struct {
	// Server is the server's name in .mcp.json.
	Server string `json:"server"`
	// Transport is "stdio", "http" or "sse" (as declared; "" if unknown).
	Transport string `json:"transport"`
	// Reason says which rule refused it, e.g. "command python3 is not in
	// TALKIDE_MCP_ALLOW_COMMANDS".
	Reason string `json:"reason"`
}

// MintRequest asks the mint endpoint for a WorkerToken.
type MintRequest struct {
	ConversationID string `json:"conversation_id"`
}

// MintResponse carries a WorkerToken for MintRequest.ConversationID.
type MintResponse struct {
	Token string `json:"token"`
	// ExpiresAt is the token's expiry (RFC 3339).
	ExpiresAt time.Time `json:"expires_at"`
}

// ExitConfig is the exit status of a TalkIDE binary that refused to start
// because its configuration (environment) is invalid: sysexits' EX_CONFIG.
// A supervisor does not restart it; starting again would fail the same way.
const ExitConfig = 78

// ExitIdentity is the exit status of a worker whose identity token was
// revoked, expired or refused by the mint with no successor
// (sysexits' EX_NOPERM). A supervisor does not restart it with the same
// token; it needs a new one (in Kubernetes, the provisioner writes it to
// the worker's Secret).
const ExitIdentity = 77

// ConfigError marks an error as a configuration error: the binaries exit
// with ExitConfig when run returns one.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }
