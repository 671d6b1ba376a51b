package devupstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// Responder decides the answer to a valid POST /v1/messages call. It is
// called from concurrent requests, so implementations must be safe for
// concurrent use. The Request must not be modified.
type Responder interface {
	Respond(req *Request) Response
}

// ResponderFunc adapts a function to a [Responder].
type ResponderFunc func(req *Request) Response

// Respond calls f(req).
func (f ResponderFunc) Respond(req *Request) Response { return f(req) }

var _ Responder = ResponderFunc(nil)

// Response describes one answer to POST /v1/messages: either an assistant
// message (Content, StopReason, Usage) or, when Error is set, an HTTP error.
// The server fills in ids, the model and token estimates.
//
// Faults apply to streaming calls as described on [StreamError] and [Cut];
// for a non-streaming call a StreamError becomes an HTTP error of the
// matching status (overloaded_error → 529) and a Cut closes the connection
// before any byte is written.
//
// JSON (admin API): see the package documentation; the delays are
// "first_byte_delay_ms" and "event_delay_ms" in milliseconds.
type Response struct {
	// Model is the model the answer names. Empty means the request's for
	// a scripted answer, ModelID for a Responder's.
	Model string
	// Content is the assistant message content, in order.
	Content []ContentBlock
	// StopReason defaults to "tool_use" when Content holds a tool_use
	// block and "end_turn" otherwise.
	StopReason string
	// Usage, when non-nil, is reported verbatim instead of the estimates
	// (omitted counts are 0). A nil CacheCreation reports all of
	// CacheCreationInputTokens as 5-minute cache writes.
	Usage *Usage

	// Error, when set, answers with this HTTP error instead of a message.
	Error *APIError
	// StreamError sends an SSE error event part-way through a 200 stream.
	StreamError *StreamError
	// Cut closes the TCP connection part-way through the answer.
	Cut *Cut

	// FirstByteDelay is waited before anything (headers included) is
	// written; EventDelay between two SSE events. Both end early when the
	// client goes away.
	FirstByteDelay time.Duration
	EventDelay     time.Duration
}

// ContentBlock is one block of an answer. Type is "text" (Text),
// "tool_use" (ID, Name, Input) or "thinking" (Thinking, Signature).
type ContentBlock struct {
	Type string `json:"type"`
	Text string `json:"text,omitempty"`
	// ID defaults to a fresh "toolu_dev_…" id.
	ID   string `json:"id,omitempty"`
	Name string `json:"name,omitempty"`
	// Input is the tool input, a JSON object; it defaults to {}.
	Input     json.RawMessage `json:"input,omitempty"`
	Thinking  string          `json:"thinking,omitempty"`
	Signature string          `json:"signature,omitempty"`
}

// Text returns a text content block.
func Text(s string) ContentBlock { return ContentBlock{Type: "text", Text: s} }

// ToolUse returns a tool_use content block calling the named tool; input
// is marshalled to JSON and must be an object (a map or struct). It panics
// if input cannot be marshalled, which is a programming error.
func ToolUse(name string, input any) ContentBlock {
	b, err := json.Marshal(input)
	if err != nil {
		panic(fmt.Sprintf("devupstream.ToolUse: marshal input: %v", err))
	}
	return ContentBlock{Type: "tool_use", Name: name, Input: b}
}

// Usage is a token count as reported in message_start and in a
// non-streaming Message (see "Anthropic Messages streaming events"). All
// counts are tokens. message_delta repeats the counts cumulatively,
// without CacheCreation.
type Usage struct {
	InputTokens              int            `json:"input_tokens"`
	CacheCreationInputTokens int            `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int            `json:"cache_read_input_tokens"`
	CacheCreation            *CacheCreation `json:"cache_creation,omitempty"`
	OutputTokens             int            `json:"output_tokens"`
}

// CacheCreation splits cache writes by time to live.
type CacheCreation struct {
	Ephemeral5mInputTokens int `json:"ephemeral_5m_input_tokens"`
	Ephemeral1hInputTokens int `json:"ephemeral_1h_input_tokens"`
}

// StreamError makes a streaming answer send, as in "Anthropic Messages
// streaming events" (an error after HTTP 200), after AfterEvents SSE events
// (0: right after the 200 headers; message_start is event 1, ping event 2),
// the event
//
//	event: error
//	data: {"type":"error","error":{"type":<Type>,"message":<Message>}}
//
// and end the stream there (cleanly: the HTTP response completes). Type
// defaults to "overloaded_error", Message to "Overloaded". If AfterEvents
// is at least the number of events, the error follows message_stop.
type StreamError struct {
	AfterEvents int    `json:"after_events"`
	Type        string `json:"type,omitempty"`
	Message     string `json:"message,omitempty"`
}

// Cut makes a streaming answer close the TCP connection abruptly (no
// terminating chunk) after AfterEvents SSE events have been written and
// flushed; 0 cuts right after the 200 headers. When both a StreamError and
// a Cut are set, the one with fewer AfterEvents wins; on a tie the error
// event is sent.
type Cut struct {
	AfterEvents int `json:"after_events"`
}

// responseJSON is the admin-API form of a Response.
type responseJSON struct {
	Content          []ContentBlock `json:"content,omitempty"`
	StopReason       string         `json:"stop_reason,omitempty"`
	Usage            *Usage         `json:"usage,omitempty"`
	Error            *APIError      `json:"error,omitempty"`
	StreamError      *StreamError   `json:"stream_error,omitempty"`
	Cut              *Cut           `json:"cut,omitempty"`
	FirstByteDelayMS int64          `json:"first_byte_delay_ms,omitempty"`
	EventDelayMS     int64          `json:"event_delay_ms,omitempty"`
}

// MarshalJSON encodes r in the admin-API form.
func (r Response) MarshalJSON() ([]byte, error) {
	return json.Marshal(responseJSON{
		Content: r.Content, StopReason: r.StopReason, Usage: r.Usage,
		Error: r.Error, StreamError: r.StreamError, Cut: r.Cut,
		FirstByteDelayMS: r.FirstByteDelay.Milliseconds(),
		EventDelayMS:     r.EventDelay.Milliseconds(),
	})
}

// UnmarshalJSON decodes the admin-API form strictly: unknown fields,
// negative delays and content blocks of an unsupported type are errors, so
// a typo in a test script fails loudly.
func (r *Response) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var j responseJSON
	if err := dec.Decode(&j); err != nil {
		return err
	}
	if j.FirstByteDelayMS < 0 || j.EventDelayMS < 0 {
		return fmt.Errorf("delays must not be negative")
	}
	for i, b := range j.Content {
		if err := b.validate(); err != nil {
			return fmt.Errorf("content.%d: %w", i, err)
		}
	}
	*r = Response{
		Content: j.Content, StopReason: j.StopReason, Usage: j.Usage,
		Error: j.Error, StreamError: j.StreamError, Cut: j.Cut,
		FirstByteDelay: time.Duration(j.FirstByteDelayMS) * time.Millisecond,
		EventDelay:     time.Duration(j.EventDelayMS) * time.Millisecond,
	}
	return nil
}

// validate reports a block the server cannot send.
func (b ContentBlock) validate() error {
	switch b.Type {
	case "text", "thinking":
		return nil
	case "tool_use":
		if b.Name == "" {
			return fmt.Errorf("tool_use block needs a name")
		}
		if len(b.Input) > 0 && firstByte(b.Input) != '{' {
			return fmt.Errorf("tool_use input must be a JSON object")
		}
		return nil
	}
	return fmt.Errorf("unsupported content block type %q (want text, tool_use or thinking)", b.Type)
}
