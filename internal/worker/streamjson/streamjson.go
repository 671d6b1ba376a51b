// Package streamjson speaks the Claude Code CLI's stream-json protocol: the
// newline-delimited JSON the CLI writes on stdout with
// `--output-format stream-json --verbose` and reads on stdin with
// `--input-format stream-json`, including the control protocol
// (control_request / control_response). Shapes are those Claude Code
// 2.1.332 (internal/worker/claudecli's pin) was seen to write and read.
//
// Main types: Reader (unbounded-line reader of stdout), Parse and the message
// types it returns (SystemInit, Assistant, User, Result, APIRetry,
// TaskStarted, TaskNotification, ControlRequest, ControlResponse, Unknown), and the stdin encoders
// (UserInput, Interrupt, ControlSuccess). It does not start processes (see
// package harness) and keeps no state.
package streamjson

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// MaxLine bounds one stdout line. Lines of the real CLI reach tens of KB
// (initialize replies ~18 KB, tool results more); 64 MiB leaves room for huge
// tool outputs without letting a runaway line exhaust memory.
const MaxLine = 64 << 20

// ErrLineTooLong is returned by Reader.Next for a line over the limit; the
// rest of that line is discarded and reading can go on.
var ErrLineTooLong = errors.New("stream-json line too long")

// Reader reads lines of any length (up to MaxLine) from the CLI's stdout.
type Reader struct {
	br  *bufio.Reader
	max int
}

// NewReader returns a Reader of r.
func NewReader(r io.Reader) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, 256<<10), max: MaxLine}
}

// Next returns the next non-empty line without its line end. At the end of
// input it returns io.EOF (a last line without "\n" is returned first).
func (r *Reader) Next() ([]byte, error) {
	for {
		var line []byte
		tooLong := false
		for {
			chunk, err := r.br.ReadSlice('\n')
			if !tooLong {
				if len(line)+len(chunk) > r.max {
					tooLong = true
					line = nil
				} else {
					line = append(line, chunk...)
				}
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err != nil {
				if err == io.EOF && len(bytes.TrimSpace(line)) > 0 && !tooLong {
					return bytes.TrimSpace(line), nil
				}
				if tooLong {
					return nil, ErrLineTooLong
				}
				return nil, err
			}
			break
		}
		if tooLong {
			return nil, ErrLineTooLong
		}
		line = bytes.TrimSpace(line)
		if len(line) > 0 {
			return line, nil
		}
	}
}

// HasLine reports whether Next can return a line without reading: a
// whole non-empty line is buffered.
func (r *Reader) HasLine() bool {
	b, _ := r.br.Peek(r.br.Buffered())
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return false
		}
		if len(bytes.TrimSpace(b[:i])) > 0 {
			return true
		}
		b = b[i+1:]
	}
}

// Message is one parsed stdout line: *SystemInit, *Assistant, *User, *Result,
// *APIRetry, *TaskStarted, *TaskNotification, *ControlRequest,
// *ControlResponse or *Unknown.
type Message interface{ messageType() string }

type header struct {
	Type    string `json:"type"`
	Subtype string `json:"subtype"`
}

// Parse decodes one stdout line. Unknown types and subtypes give *Unknown
// (the CLI adds new ones; they must be ignored, not fatal). A line that is not
// a JSON object gives an error.
func Parse(line []byte) (Message, error) {
	var h header
	if err := json.Unmarshal(line, &h); err != nil {
		return nil, fmt.Errorf("parse stream-json line: %w", err)
	}
	var m Message
	switch {
	case h.Type == "system" && h.Subtype == "init":
		m = &SystemInit{}
	case h.Type == "system" && h.Subtype == "api_retry":
		m = &APIRetry{}
	case h.Type == "system" && h.Subtype == "task_started":
		m = &TaskStarted{}
	case h.Type == "system" && h.Subtype == "task_notification":
		m = &TaskNotification{}
	case h.Type == "assistant":
		m = &Assistant{}
	case h.Type == "user":
		m = &User{}
	case h.Type == "result":
		m = &Result{}
	case h.Type == "control_request":
		m = &ControlRequest{}
	case h.Type == "control_response":
		m = &ControlResponse{}
	default:
		return &Unknown{Type: h.Type, Subtype: h.Subtype, Raw: append(json.RawMessage(nil), line...)}, nil
	}
	if err := json.Unmarshal(line, m); err != nil {
		return nil, fmt.Errorf("parse stream-json %s line: %w", h.Type, err)
	}
	return m, nil
}

// SystemInit is the system/init line, emitted before every turn.
type SystemInit struct {
	SessionID         string   `json:"session_id"`
	Cwd               string   `json:"cwd"`
	Model             string   `json:"model"`
	PermissionMode    string   `json:"permissionMode"`
	APIKeySource      string   `json:"apiKeySource"`
	ClaudeCodeVersion string   `json:"claude_code_version"`
	Tools             []string `json:"tools"`
	MCPServers        []struct {
		Name   string `json:"name"`
		Status string `json:"status"`
	} `json:"mcp_servers"`
}

// ContentBlock is one block of an Anthropic message as the CLI prints it.
// Content of a tool_result is a string or a list of blocks (see ResultText).
type ContentBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"`
	IsError   bool            `json:"is_error,omitempty"`
}

// ResultText returns a tool_result block's content as text: a string as is,
// a list of blocks as their text parts joined by newlines.
func (b ContentBlock) ResultText() string {
	if len(b.Content) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(b.Content, &s) == nil {
		return s
	}
	var blocks []ContentBlock
	if json.Unmarshal(b.Content, &blocks) != nil {
		return string(b.Content)
	}
	var buf bytes.Buffer
	for _, c := range blocks {
		if c.Type == "text" {
			if buf.Len() > 0 {
				buf.WriteByte('\n')
			}
			buf.WriteString(c.Text)
		}
	}
	return buf.String()
}

// APIMessage is the "message" of assistant and user lines.
type APIMessage struct {
	ID      string          `json:"id"`
	Role    string          `json:"role"`
	Model   string          `json:"model"`
	Content json.RawMessage `json:"content"`
}

// Blocks returns the message content as blocks; string content becomes one
// text block.
func (m APIMessage) Blocks() []ContentBlock {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return []ContentBlock{{Type: "text", Text: s}}
	}
	var blocks []ContentBlock
	_ = json.Unmarshal(m.Content, &blocks) // a malformed content is treated as empty
	return blocks
}

// Assistant is an assistant line: one content block of a model answer, or a
// synthetic API error message (IsAPIErrorMessage).
//
// A line of a sub-agent (started by the main agent's Agent tool, listed as
// "Task" in system/init) has ParentToolUseID set to that Agent call's
// tool_use id and AgentID to the sub-agent's id (the task_id of its
// TaskStarted); the main agent's lines have ParentToolUseID null and no
// AgentID.
type Assistant struct {
	Message           APIMessage `json:"message"`
	SessionID         string     `json:"session_id"`
	ParentToolUseID   *string    `json:"parent_tool_use_id"`
	AgentID           string     `json:"agent_id"`
	RequestID         string     `json:"request_id"`
	IsAPIErrorMessage bool       `json:"is_api_error_message"`
	APIErrorStatus    int        `json:"api_error_status"`
}

// User is a user line: tool results (and, with --replay-user-messages,
// echoed prompts). A sub-agent's lines (its prompt as a text block, its tool
// results) carry ParentToolUseID and AgentID as on Assistant.
type User struct {
	Message         APIMessage `json:"message"`
	SessionID       string     `json:"session_id"`
	ParentToolUseID *string    `json:"parent_tool_use_id"`
	AgentID         string     `json:"agent_id"`
	UUID            string     `json:"uuid"`
	IsReplay        bool       `json:"isReplay"`
}

// Usage is the token usage of a result line.
type Usage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

// Result ends one turn. IsError (not Subtype) tells a failed turn.
// TotalCostUSD is cumulative for the session (it continues after --resume).
type Result struct {
	Subtype        string   `json:"subtype"`
	IsError        bool     `json:"is_error"`
	Result         string   `json:"result"`
	SessionID      string   `json:"session_id"`
	StopReason     string   `json:"stop_reason"`
	TerminalReason string   `json:"terminal_reason"`
	NumTurns       int      `json:"num_turns"`
	DurationMS     int64    `json:"duration_ms"`
	TotalCostUSD   float64  `json:"total_cost_usd"`
	Usage          Usage    `json:"usage"`
	APIErrorStatus *int     `json:"api_error_status"`
	Errors         []string `json:"errors"`
}

// APIRetry is a system/api_retry line, printed before each retry.
type APIRetry struct {
	Attempt      int    `json:"attempt"`
	MaxRetries   int    `json:"max_retries"`
	RetryDelayMS int64  `json:"retry_delay_ms"`
	ErrorStatus  *int   `json:"error_status"`
	Error        string `json:"error"`
}

// TaskStarted is a system/task_started line: a background task began. For a
// sub-agent (TaskType "local_agent") TaskID is the sub-agent's id (the
// agent_id of its lines and of its can_use_tool requests) and ToolUseID the
// Agent call that started it. Bash commands that run a while start tasks
// too (TaskType "local_bash").
type TaskStarted struct {
	TaskID         string `json:"task_id"`
	ToolUseID      string `json:"tool_use_id"`
	TaskType       string `json:"task_type"`
	SubagentType   string `json:"subagent_type"`
	Description    string `json:"description"`
	IsBackgrounded bool   `json:"is_backgrounded"`
}

// TaskNotification is a system/task_notification line: a task ended
// (Status "completed", …). Fields as on TaskStarted.
type TaskNotification struct {
	TaskID    string `json:"task_id"`
	ToolUseID string `json:"tool_use_id"`
	Status    string `json:"status"`
}

// ControlRequest is a request from the CLI to the host (can_use_tool,
// hook_callback, mcp_message) or the echo of none: the host answers each with
// a ControlResponse of the same RequestID.
type ControlRequest struct {
	RequestID string          `json:"request_id"`
	Request   json.RawMessage `json:"request"`
}

// Subtype returns the request's subtype, e.g. "can_use_tool".
func (c *ControlRequest) Subtype() string {
	var h header
	_ = json.Unmarshal(c.Request, &h)
	return h.Subtype
}

// ControlResponse answers a control request the host sent.
type ControlResponse struct {
	Response struct {
		Subtype   string          `json:"subtype"`
		RequestID string          `json:"request_id"`
		Response  json.RawMessage `json:"response"`
		Error     string          `json:"error"`
	} `json:"response"`
}

// Unknown is a line of a type this package does not model.
type Unknown struct {
	Type    string
	Subtype string
	Raw     json.RawMessage
}

func (*SystemInit) messageType() string       { return "system/init" }
func (*APIRetry) messageType() string         { return "system/api_retry" }
func (*TaskStarted) messageType() string      { return "system/task_started" }
func (*TaskNotification) messageType() string { return "system/task_notification" }
func (*Assistant) messageType() string        { return "assistant" }
func (*User) messageType() string             { return "user" }
func (*Result) messageType() string           { return "result" }
func (*ControlRequest) messageType() string   { return "control_request" }
func (*ControlResponse) messageType() string  { return "control_response" }
func (u *Unknown) messageType() string        { return u.Type }

// UserInput encodes a user message for stdin. uuid, when set, becomes the
// transcript uuid of the message.
func UserInput(text, uuid string) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	v := struct {
		Type            string  `json:"type"`
		UUID            string  `json:"uuid,omitempty"`
		Message         msg     `json:"message"`
		ParentToolUseID *string `json:"parent_tool_use_id"`
	}{Type: "user", UUID: uuid, Message: msg{Role: "user", Content: text}}
	return mustLine(v)
}

// ControlRequestLine encodes a host → CLI control request (e.g. subtype
// "interrupt" or "initialize") with extra request fields.
func ControlRequestLine(requestID, subtype string, fields map[string]any) []byte {
	req := map[string]any{"subtype": subtype}
	for k, v := range fields {
		req[k] = v
	}
	return mustLine(map[string]any{"type": "control_request", "request_id": requestID, "request": req})
}

// ControlSuccess encodes the host's success answer to a CLI control request.
func ControlSuccess(requestID string, response any) []byte {
	return mustLine(map[string]any{
		"type":     "control_response",
		"response": map[string]any{"subtype": "success", "request_id": requestID, "response": response},
	})
}

// ControlError encodes the host's error answer to a CLI control request.
func ControlError(requestID, msg string) []byte {
	return mustLine(map[string]any{
		"type":     "control_response",
		"response": map[string]any{"subtype": "error", "request_id": requestID, "error": msg},
	})
}

func mustLine(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("streamjson: marshal %T: %v", v, err)) // only fixed shapes are marshalled
	}
	return append(b, '\n')
}
