package devupstream

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// MaxBodyBytes is the largest request body accepted: 32 MiB, the Messages
// API limit. A larger body is answered with 413 request_too_large.
const MaxBodyBytes = 32 << 20

// Request is a parsed POST /v1/messages (or count_tokens) call as a
// [Responder] sees it. Decoding is lenient: fields whose shape is unexpected
// are left empty rather than rejected, and unknown fields are ignored.
type Request struct {
	Method string
	Path   string      // URL path, e.g. "/v1/messages"
	Query  url.Values  // e.g. beta=true
	Header http.Header // as received, credentials included
	Body   []byte      // raw request body

	Model     string
	MaxTokens int // 0 for count_tokens calls that omit it
	Stream    bool
	// System holds the texts of the top-level system prompt: one entry for
	// a string, one per text block for an array.
	System   []string
	Messages []Message // in order, role "system" entries included
	Tools    []Tool
	// OutputFormat is output_config.format.type (e.g. "json_schema"), and
	// OutputSchema its output_config.format.schema; both empty when absent.
	OutputFormat string
	OutputSchema json.RawMessage

	// InputTokens is the deterministic input estimate: bytes of the raw
	// messages, system and tools JSON divided by 4, at least 1.
	InputTokens int
}

// Message is one entry of the request's messages array. A string content
// is normalised to a single text block.
type Message struct {
	Role    string // "user", "assistant" or "system" (the CLI sends all three)
	Content []Block
}

// Block is one content block of a request message. Only the fields of its
// type are set; Raw always holds the block as sent.
type Block struct {
	Type string // "text", "tool_use", "tool_result", "image", "thinking", or anything else
	Text string // text blocks

	ID    string          // tool_use
	Name  string          // tool_use
	Input json.RawMessage // tool_use

	ToolUseID string // tool_result
	IsError   bool   // tool_result
	// ResultText is a tool_result's content: the string itself, or the text
	// blocks of an array joined with "\n".
	ResultText string

	Thinking string // thinking

	Raw json.RawMessage
}

// Tool is one entry of the request's tools array.
type Tool struct {
	Name         string
	Type         string // empty for custom tools, e.g. "web_search_20250305" for server tools
	DeferLoading bool
}

// HasTool reports whether the request offers a tool with this name.
func (r *Request) HasTool(name string) bool {
	for _, t := range r.Tools {
		if t.Name == name {
			return true
		}
	}
	return false
}

// parseRequest decodes a Messages (or count_tokens) request body. It fails
// only on what every Messages call needs: a JSON object, a non-empty string
// model, a non-empty messages array of objects and, when needMaxTokens,
// an integer max_tokens of at least 1. The error is an *APIError with
// status 400 and type invalid_request_error.
func parseRequest(body []byte, needMaxTokens bool) (*Request, error) {
	var top struct {
		Model        json.RawMessage `json:"model"`
		MaxTokens    json.RawMessage `json:"max_tokens"`
		Stream       json.RawMessage `json:"stream"`
		System       json.RawMessage `json:"system"`
		Messages     json.RawMessage `json:"messages"`
		Tools        json.RawMessage `json:"tools"`
		OutputConfig json.RawMessage `json:"output_config"`
	}
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, invalidRequest("request body is not a valid JSON object: " + err.Error())
	}
	req := &Request{Body: body}

	if isAbsent(top.Model) {
		return nil, invalidRequest("model: Field required")
	}
	if err := json.Unmarshal(top.Model, &req.Model); err != nil {
		return nil, invalidRequest("model: Input should be a valid string")
	}
	if req.Model == "" {
		return nil, invalidRequest("model: String should have at least 1 character")
	}

	if isAbsent(top.Messages) {
		return nil, invalidRequest("messages: Field required")
	}
	var rawMsgs []json.RawMessage
	if err := json.Unmarshal(top.Messages, &rawMsgs); err != nil {
		return nil, invalidRequest("messages: Input should be a valid list")
	}
	if len(rawMsgs) == 0 {
		return nil, invalidRequest("messages: at least one message is required")
	}
	for i, raw := range rawMsgs {
		m, ok := parseMessage(raw)
		if !ok {
			return nil, invalidRequest("messages." + strconv.Itoa(i) + ": Input should be a valid dictionary")
		}
		req.Messages = append(req.Messages, m)
	}

	if needMaxTokens {
		if isAbsent(top.MaxTokens) {
			return nil, invalidRequest("max_tokens: Field required")
		}
		var n int64
		if err := json.Unmarshal(top.MaxTokens, &n); err != nil {
			return nil, invalidRequest("max_tokens: Input should be a valid integer")
		}
		if n < 1 {
			return nil, invalidRequest("max_tokens: Input should be greater than or equal to 1")
		}
		req.MaxTokens = int(min(n, 1<<31-1))
	}

	// Everything below is optional and decoded leniently: a shape we do not
	// understand is dropped, never rejected.
	_ = json.Unmarshal(top.Stream, &req.Stream)
	req.System = parseSystem(top.System)
	req.Tools = parseTools(top.Tools)
	var oc struct {
		Format struct {
			Type   string          `json:"type"`
			Schema json.RawMessage `json:"schema"`
		} `json:"format"`
	}
	if !isAbsent(top.OutputConfig) {
		// Type mismatches leave the affected fields empty; see parseBlock.
		_ = json.Unmarshal(top.OutputConfig, &oc)
	}
	req.OutputFormat = oc.Format.Type
	req.OutputSchema = oc.Format.Schema

	req.InputTokens = estimateTokens(len(top.Messages) + len(top.System) + len(top.Tools))
	return req, nil
}

// isAbsent reports whether a raw JSON field was missing or null.
func isAbsent(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// firstByte returns the first non-space byte of a JSON value, or 0.
func firstByte(raw json.RawMessage) byte {
	t := bytes.TrimLeft(raw, " \t\r\n")
	if len(t) == 0 {
		return 0
	}
	return t[0]
}

// parseMessage decodes one messages entry; ok is false when it is not an
// object. Content that is neither a string nor an array is dropped.
func parseMessage(raw json.RawMessage) (Message, bool) {
	if firstByte(raw) != '{' {
		return Message{}, false
	}
	var w struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	// encoding/json keeps decoding after a type mismatch and fills every
	// field it can, so a wrong-typed role still leaves Content usable.
	_ = json.Unmarshal(raw, &w)
	return Message{Role: w.Role, Content: parseContent(w.Content)}, true
}

// parseContent decodes message content: a string becomes one text block,
// an array one Block per element.
func parseContent(raw json.RawMessage) []Block {
	switch firstByte(raw) {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return nil
		}
		return []Block{{Type: "text", Text: s, Raw: raw}}
	case '[':
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) != nil {
			return nil
		}
		blocks := make([]Block, 0, len(items))
		for _, it := range items {
			blocks = append(blocks, parseBlock(it))
		}
		return blocks
	}
	return nil
}

// parseBlock decodes one content block. A block that is not an object
// gets an empty Type, which every consumer ignores.
func parseBlock(raw json.RawMessage) Block {
	var w struct {
		Type      string          `json:"type"`
		Text      string          `json:"text"`
		ID        string          `json:"id"`
		Name      string          `json:"name"`
		Input     json.RawMessage `json:"input"`
		ToolUseID string          `json:"tool_use_id"`
		Content   json.RawMessage `json:"content"`
		IsError   bool            `json:"is_error"`
		Thinking  string          `json:"thinking"`
	}
	if firstByte(raw) != '{' {
		return Block{Raw: raw}
	}
	// On a type mismatch encoding/json skips that field, fills the others
	// and returns the first error: exactly the leniency wanted here.
	_ = json.Unmarshal(raw, &w)
	b := Block{
		Type: w.Type, Text: w.Text,
		ID: w.ID, Name: w.Name, Input: w.Input,
		ToolUseID: w.ToolUseID, IsError: w.IsError,
		Thinking: w.Thinking,
		Raw:      raw,
	}
	if w.Type == "tool_result" {
		b.ResultText = resultText(w.Content)
	}
	return b
}

// resultText flattens a tool_result content: a string, or an array of
// blocks whose text blocks are joined with "\n".
func resultText(raw json.RawMessage) string {
	var parts []string
	for _, b := range parseContent(raw) {
		if b.Type == "text" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// parseSystem decodes the top-level system prompt: a string or an array of
// text blocks.
func parseSystem(raw json.RawMessage) []string {
	var out []string
	for _, b := range parseContent(raw) {
		if b.Type == "text" {
			out = append(out, b.Text)
		}
	}
	return out
}

// parseTools decodes the tools array; entries that are not objects are
// skipped.
func parseTools(raw json.RawMessage) []Tool {
	if firstByte(raw) != '[' {
		return nil
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil
	}
	tools := make([]Tool, 0, len(items))
	for _, it := range items {
		if firstByte(it) != '{' {
			continue
		}
		var w struct {
			Name         string `json:"name"`
			Type         string `json:"type"`
			DeferLoading bool   `json:"defer_loading"`
		}
		_ = json.Unmarshal(it, &w) // lenient, see parseBlock
		tools = append(tools, Tool(w))
	}
	return tools
}

// estimateTokens turns a byte count into a token estimate: bytes/4, at
// least 1.
func estimateTokens(n int) int {
	return max(n/4, 1)
}
