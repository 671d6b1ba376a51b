package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"
)

// Reporting endpoints (worker → control plane), under PathReportPrefix. Every
// call carries a WorkerToken of the conversation the report belongs to in
// X-Worker-Token (minted with the identity token, as for model calls): the
// control plane takes tenant, env, conversation and user from the token,
// never from the body, so a worker can only report into its own tenant-env.
// Every write carries an idempotency key; a retried write is stored once and
// answered with the first answer (Duplicate set).
const (
	PathReportToolEvents   = "/api/internal/worker/tool-events"              // POST ToolEventReport → 200 ReportAck
	PathReportUsage        = "/api/internal/worker/usage"                    // POST UsageReport → 200 ReportAck
	PathReportActivity     = "/api/internal/worker/activity"                 // POST ActivityReport → 200 ReportAck
	PathReportBatch        = "/api/internal/worker/report-batches"           // POST ReportBatch → 200 ReportBatchAck
	PathReportIssues       = "/api/internal/worker/issues"                   // POST IssueCreate → 200 IssueAck; GET → 200 IssueList
	PathReportIssue        = "/api/internal/worker/issues/{number}"          // GET → 200 Issue
	PathReportIssueUpdate  = "/api/internal/worker/issues/{number}/update"   // POST IssueUpdate → 200 IssueAck
	PathReportIssueComment = "/api/internal/worker/issues/{number}/comments" // POST IssueComment → 200 IssueAck
)

// Limits of report fields. The worker truncates to them; the control plane
// refuses larger values.
const (
	MaxReportBody    = 256 << 10 // bytes of one report request body
	MaxToolInput     = 64 << 10  // bytes of ToolEventReport.Input (JSON)
	MaxToolOutput    = 16 << 10  // bytes of ToolEventReport.Output
	MaxSummary       = 2 << 10   // bytes of ActivityReport.Summary
	MaxIssueTitle    = 200       // characters of an issue title
	MaxIssueBody     = 32 << 10  // bytes of an issue body or comment
	MaxIdempotencyID = 200       // bytes of an idempotency key

	MaxReportBatchBody    = 4 << 20 // bytes of one ReportBatch request body
	MaxReportBatchGroups  = 256     // conversations (groups) in one ReportBatch
	MaxReportBatchReports = 1000    // reports in one ReportBatch, all groups together
)

// Tool event phases.
const (
	ToolPhaseUse    = "use"    // the model called the tool
	ToolPhaseResult = "result" // the call finished
)

// Turn outcomes in UsageReport.
const (
	OutcomeCompleted = "completed"
	OutcomeFailed    = "failed"
)

// Issue states.
const (
	IssueOpen   = "open"
	IssueClosed = "closed"
)

// ValidText reports whether s can be stored as text: valid UTF-8 without
// NUL, which PostgreSQL's text columns cannot hold (a report carrying one
// would fail to store on every try instead of being refused once).
func ValidText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// ErrInvalidReport is wrapped by the Validate methods.
var ErrInvalidReport = errors.New("invalid report")

var idempotencyKeyRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]*$`)

// ValidIdempotencyKey checks a key: 1–200 characters of [A-Za-z0-9_.:-], not
// starting with a punctuation character.
func ValidIdempotencyKey(k string) error {
	if len(k) > MaxIdempotencyID || !idempotencyKeyRe.MatchString(k) {
		return fmt.Errorf("%w: idempotency_key must be 1-%d characters of [A-Za-z0-9_.:-]", ErrInvalidReport, MaxIdempotencyID)
	}
	return nil
}

// ToolEventReport reports one tool call's start (phase "use") or end (phase
// "result"), from the worker's tool_use and tool_result events.
type ToolEventReport struct {
	IdempotencyKey string `json:"idempotency_key"`
	// EventID is the id of the worker event the report comes from.
	EventID int64     `json:"event_id"`
	Time    time.Time `json:"time"`
	// Phase is ToolPhaseUse or ToolPhaseResult.
	Phase     string `json:"phase"`
	ToolUseID string `json:"tool_use_id"`
	// Name and Input are set for phase "use" (Input at most MaxToolInput
	// bytes; larger inputs are replaced by {"truncated":true,"bytes":N}).
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
	// Output and IsError are set for phase "result" (Output at most
	// MaxToolOutput bytes).
	Output  string `json:"output,omitempty"`
	IsError bool   `json:"is_error,omitempty"`
}

// Validate checks r as the control plane does.
func (r *ToolEventReport) Validate() error {
	if err := validCommon(r.IdempotencyKey, r.EventID, r.Time); err != nil {
		return err
	}
	if r.ToolUseID == "" || len(r.ToolUseID) > 200 || !ValidText(r.ToolUseID) {
		return fmt.Errorf("%w: tool_use_id must be 1-200 bytes of text", ErrInvalidReport)
	}
	switch r.Phase {
	case ToolPhaseUse:
		if r.Name == "" || len(r.Name) > 200 || !ValidText(r.Name) {
			return fmt.Errorf("%w: name must be 1-200 bytes of text for phase use", ErrInvalidReport)
		}
		if len(r.Input) > MaxToolInput || (len(r.Input) > 0 && !json.Valid(r.Input)) {
			return fmt.Errorf("%w: input must be JSON of at most %d bytes", ErrInvalidReport, MaxToolInput)
		}
	case ToolPhaseResult:
		if len(r.Output) > MaxToolOutput || !ValidText(r.Output) {
			return fmt.Errorf("%w: output must be text of at most %d bytes", ErrInvalidReport, MaxToolOutput)
		}
	default:
		return fmt.Errorf("%w: phase must be %q or %q", ErrInvalidReport, ToolPhaseUse, ToolPhaseResult)
	}
	return nil
}

// UsageReport reports the token usage of one turn, from the worker's
// turn_completed and turn_failed events. The gateway's ledger stays the
// authority for billing; this is the conversation's own account.
type UsageReport struct {
	IdempotencyKey  string    `json:"idempotency_key"`
	EventID         int64     `json:"event_id"`
	Time            time.Time `json:"time"`
	ClientMessageID string    `json:"client_message_id"`
	// Outcome is OutcomeCompleted or OutcomeFailed.
	Outcome     string `json:"outcome"`
	Usage       Usage  `json:"usage"`
	CostNanoUSD int64  `json:"cost_nano_usd"`
	NumTurns    int    `json:"num_turns"`
	DurationMS  int64  `json:"duration_ms"`
}

// Validate checks r as the control plane does.
func (r *UsageReport) Validate() error {
	if err := validCommon(r.IdempotencyKey, r.EventID, r.Time); err != nil {
		return err
	}
	if r.Outcome != OutcomeCompleted && r.Outcome != OutcomeFailed {
		return fmt.Errorf("%w: outcome must be %q or %q", ErrInvalidReport, OutcomeCompleted, OutcomeFailed)
	}
	if len(r.ClientMessageID) > 64 || !ValidText(r.ClientMessageID) {
		return fmt.Errorf("%w: client_message_id must be text of at most 64 bytes", ErrInvalidReport)
	}
	u := r.Usage
	if u.InputTokens < 0 || u.OutputTokens < 0 || u.CacheCreationInputTokens < 0 || u.CacheReadInputTokens < 0 ||
		r.CostNanoUSD < 0 || r.NumTurns < 0 || r.DurationMS < 0 {
		return fmt.Errorf("%w: negative count", ErrInvalidReport)
	}
	return nil
}

// ActivityReport is one entry of a conversation's activity log: one per
// worker event, with a short human-readable summary.
type ActivityReport struct {
	IdempotencyKey string    `json:"idempotency_key"`
	EventID        int64     `json:"event_id"`
	Time           time.Time `json:"time"`
	// Type is the worker event's type.
	Type EventType `json:"type"`
	// Summary is at most MaxSummary bytes.
	Summary string `json:"summary"`
	// Ref is what the event is about, when it names something a later
	// event settles: the request id of permission_requested and
	// permission_resolved, the build id of build events; at most 200 bytes.
	Ref string `json:"ref,omitempty"`
}

// Validate checks r as the control plane does.
func (r *ActivityReport) Validate() error {
	if err := validCommon(r.IdempotencyKey, r.EventID, r.Time); err != nil {
		return err
	}
	if r.Type == "" || len(r.Type) > 64 {
		return fmt.Errorf("%w: type must be 1-64 bytes", ErrInvalidReport)
	}
	if len(r.Summary) > MaxSummary || !ValidText(r.Summary) {
		return fmt.Errorf("%w: summary must be text of at most %d bytes", ErrInvalidReport, MaxSummary)
	}
	if len(r.Ref) > 200 || !ValidText(r.Ref) {
		return fmt.Errorf("%w: ref must be text of at most 200 bytes", ErrInvalidReport)
	}
	return nil
}

func validCommon(key string, eventID int64, t time.Time) error {
	if err := ValidIdempotencyKey(key); err != nil {
		return err
	}
	if eventID < 1 {
		return fmt.Errorf("%w: event_id must be at least 1", ErrInvalidReport)
	}
	if t.IsZero() {
		return fmt.Errorf("%w: time is required", ErrInvalidReport)
	}
	return nil
}

// Kinds of report in a ReportBatch.
const (
	ReportKindToolEvent = "tool_event" // a ToolEventReport
	ReportKindUsage     = "usage"      // a UsageReport
	ReportKindActivity  = "activity"   // an ActivityReport
)

// ReportKindPath is the single-report endpoint of a report kind ("" for an
// unknown kind). A report's receipt hash is taken over this path and the
// report's bytes, so a report sent alone and again in a batch is the same
// report.
func ReportKindPath(kind string) string {
	switch kind {
	case ReportKindToolEvent:
		return PathReportToolEvents
	case ReportKindUsage:
		return PathReportUsage
	case ReportKindActivity:
		return PathReportActivity
	}
	return ""
}

// ReportBatch carries the tool event, usage and activity reports of several
// conversations in one request (POST PathReportBatch), which the control
// plane stores in one transaction. The request carries a WorkerToken of one
// of its conversations in X-Worker-Token, checked before the body is read.
// Each group is one conversation's reports under that conversation's
// WorkerToken, of the same tenant-env: the token, not the body, says whose
// reports they are, exactly as X-Worker-Token does for one report. At
// most MaxReportBatchGroups groups and MaxReportBatchReports reports in
// all, in MaxReportBatchBody bytes.
type ReportBatch struct {
	Groups []ReportGroup `json:"groups"`
}

// ReportGroup is one conversation's reports in a ReportBatch, in the order
// they are to be stored.
type ReportGroup struct {
	// WorkerToken is a WorkerToken of the conversation (as minted).
	WorkerToken string          `json:"worker_token"`
	Reports     []BatchedReport `json:"reports"`
}

// BatchedReport is one report of a ReportGroup: Kind is a ReportKind*
// constant and Report the report's JSON, as the kind's own endpoint takes it.
type BatchedReport struct {
	Kind   string          `json:"kind"`
	Report json.RawMessage `json:"report"`
}

// ReportBatchAck answers a ReportBatch: one entry per group, in order.
type ReportBatchAck struct {
	Groups []ReportGroupAck `json:"groups"`
}

// ReportGroupAck is the answer for one group. Status 200: the token was
// accepted and Results answers each report in order. 401 (an invalid or
// expired token) or 403 (a token not scoped to a conversation, or of
// another tenant-env than the request's): nothing of the group was stored,
// and Error says why.
type ReportGroupAck struct {
	Status  int            `json:"status"`
	Error   *ErrorDetail   `json:"error,omitempty"`
	Results []ReportResult `json:"results,omitempty"`
}

// ReportResult answers one report of a batch. Status 200: stored, or
// stored before under its idempotency key (Duplicate set). 400: invalid;
// 409: the key was used before for another report (neither is stored, and
// retrying the same report cannot change that). 500: it could not be
// stored now; send it again.
type ReportResult struct {
	Status    int          `json:"status"`
	Duplicate bool         `json:"duplicate,omitempty"`
	Error     *ErrorDetail `json:"error,omitempty"`
}

// ReportAck answers a stored tool event, usage or activity report.
type ReportAck struct {
	IdempotencyKey string `json:"idempotency_key"`
	// Duplicate is true when the key had been stored before; nothing changed.
	Duplicate bool `json:"duplicate"`
}

// IssueCreate files a new issue in the conversation's tenant-env (the
// create_issue tool of the talkide-issue-tracking MCP server).
type IssueCreate struct {
	IdempotencyKey string `json:"idempotency_key"`
	// Title is 1–MaxIssueTitle characters, one line.
	Title string `json:"title"`
	// Body is optional, at most MaxIssueBody bytes (Markdown).
	Body string `json:"body,omitempty"`
}

// Validate checks c and trims the title.
func (c *IssueCreate) Validate() error {
	if err := ValidIdempotencyKey(c.IdempotencyKey); err != nil {
		return err
	}
	c.Title = strings.TrimSpace(c.Title)
	if err := ValidIssueTitle(c.Title); err != nil {
		return err
	}
	return validIssueText("body", c.Body)
}

// IssueUpdate changes an issue; absent fields stay as they are.
type IssueUpdate struct {
	IdempotencyKey string  `json:"idempotency_key"`
	Title          *string `json:"title,omitempty"`
	Body           *string `json:"body,omitempty"`
	// State is IssueOpen or IssueClosed.
	State *string `json:"state,omitempty"`
}

// Validate checks u and trims the title.
func (u *IssueUpdate) Validate() error {
	if err := ValidIdempotencyKey(u.IdempotencyKey); err != nil {
		return err
	}
	if u.Title == nil && u.Body == nil && u.State == nil {
		return fmt.Errorf("%w: nothing to update: give title, body or state", ErrInvalidReport)
	}
	if u.Title != nil {
		t := strings.TrimSpace(*u.Title)
		u.Title = &t
		if err := ValidIssueTitle(t); err != nil {
			return err
		}
	}
	if u.Body != nil {
		if err := validIssueText("body", *u.Body); err != nil {
			return err
		}
	}
	if u.State != nil && *u.State != IssueOpen && *u.State != IssueClosed {
		return fmt.Errorf("%w: state must be %q or %q", ErrInvalidReport, IssueOpen, IssueClosed)
	}
	return nil
}

// IssueComment adds a comment to an issue.
type IssueComment struct {
	IdempotencyKey string `json:"idempotency_key"`
	// Body is 1–MaxIssueBody bytes (Markdown).
	Body string `json:"body"`
}

// Validate checks c.
func (c *IssueComment) Validate() error {
	if err := ValidIdempotencyKey(c.IdempotencyKey); err != nil {
		return err
	}
	if strings.TrimSpace(c.Body) == "" {
		return fmt.Errorf("%w: body must not be empty", ErrInvalidReport)
	}
	return validIssueText("body", c.Body)
}

// ValidIssueTitle checks a (trimmed) title: 1–MaxIssueTitle characters of
// UTF-8 on one line.
func ValidIssueTitle(t string) error {
	if t == "" || !ValidText(t) || utf8.RuneCountInString(t) > MaxIssueTitle || strings.ContainsAny(t, "\r\n") {
		return fmt.Errorf("%w: title must be one line of 1-%d characters", ErrInvalidReport, MaxIssueTitle)
	}
	return nil
}

func validIssueText(field, s string) error {
	if len(s) > MaxIssueBody || !ValidText(s) {
		return fmt.Errorf("%w: %s must be text (UTF-8, no NUL) of at most %d bytes", ErrInvalidReport, field, MaxIssueBody)
	}
	return nil
}

// Issue is an issue of a tenant-env, as the reporting and browser APIs
// return it.
type Issue struct {
	// Number is the issue's number within its tenant-env: 1, 2, 3, …
	Number int64  `json:"number"`
	Tenant string `json:"tenant"`
	Env    string `json:"env"`
	Title  string `json:"title"`
	Body   string `json:"body"`
	// State is IssueOpen or IssueClosed.
	State string `json:"state"`
	// ConversationID and UserID say where the issue was filed from.
	ConversationID string    `json:"conversation_id"`
	UserID         string    `json:"user_id"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
	// Comments are given only when one issue is read, oldest first.
	Comments []IssueCommentEntry `json:"comments,omitempty"`
}

// IssueCommentEntry is a stored comment of an issue.
type IssueCommentEntry struct {
	// Seq numbers the comments of an issue: 1, 2, 3, …
	Seq            int64     `json:"seq"`
	Body           string    `json:"body"`
	ConversationID string    `json:"conversation_id"`
	UserID         string    `json:"user_id"`
	CreatedAt      time.Time `json:"created_at"`
}

// IssueAck answers an issue write with the issue as it is afterwards (as
// it was after the first write, for a duplicate).
type IssueAck struct {
	IdempotencyKey string `json:"idempotency_key"`
	Duplicate      bool   `json:"duplicate"`
	Issue          Issue  `json:"issue"`
}

// IssueList is a page of a tenant-env's issues, newest first.
type IssueList struct {
	Issues []Issue `json:"issues"`
}

// ConversationActivity is a conversation's reported activity (browser API).
type ConversationActivity struct {
	ConversationID string `json:"conversation_id"`
	// Activity is the activity log, in event order.
	Activity []ActivityEntry `json:"activity"`
	// ToolCalls are the tool calls, in the order they started.
	ToolCalls []ToolCall `json:"tool_calls"`
	// Turns are the turns' token usage, in order.
	Turns []TurnUsage `json:"turns"`
}

// ActivityEntry is one stored ActivityReport.
type ActivityEntry struct {
	EventID int64     `json:"event_id"`
	Type    EventType `json:"type"`
	Time    time.Time `json:"time"`
	Summary string    `json:"summary"`
}

// ToolCall is a tool call assembled from its tool event reports.
type ToolCall struct {
	ToolUseID string          `json:"tool_use_id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	// Status is "running" (no result reported yet), "ok", "error", or
	// "interrupted" (no result, and its turn has ended: interrupted or cut
	// by a worker restart).
	Status string `json:"status"`
	Output string `json:"output"`
	// StartedAt and FinishedAt are the event times; absent when not
	// reported (yet).
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// TurnUsage is one stored UsageReport.
type TurnUsage struct {
	EventID         int64     `json:"event_id"`
	Time            time.Time `json:"time"`
	ClientMessageID string    `json:"client_message_id"`
	Outcome         string    `json:"outcome"`
	Usage           Usage     `json:"usage"`
	CostNanoUSD     int64     `json:"cost_nano_usd"`
	NumTurns        int       `json:"num_turns"`
	DurationMS      int64     `json:"duration_ms"`
}
