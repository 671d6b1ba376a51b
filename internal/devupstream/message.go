package devupstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// message is a finished assistant message, ready to be written as a
// non-streaming Message or as SSE events.
type message struct {
	ID         string
	Model      string
	Content    []ContentBlock // validated; tool_use ids and inputs filled
	StopReason string
	Usage      Usage // CacheCreation always set
}

// buildMessage turns a Response into a message: it validates the blocks,
// fills tool_use ids and inputs, the stop reason and the usage. newID
// makes fresh ids from a prefix.
func buildMessage(req *Request, resp Response, newID func(prefix string) string) (*message, error) {
	m := &message{ID: newID("msg_dev_"), Model: req.Model, StopReason: resp.StopReason}
	if resp.Model != "" {
		m.Model = resp.Model
	}
	out := 0
	for i, b := range resp.Content {
		if err := b.validate(); err != nil {
			return nil, fmt.Errorf("content.%d: %w", i, err)
		}
		if b.Type == "tool_use" {
			if b.ID == "" {
				b.ID = newID("toolu_dev_")
			}
			if len(b.Input) == 0 {
				b.Input = json.RawMessage("{}")
			}
			var buf bytes.Buffer
			if err := json.Compact(&buf, b.Input); err != nil {
				return nil, fmt.Errorf("content.%d: tool_use input: %w", i, err)
			}
			b.Input = buf.Bytes()
			if m.StopReason == "" {
				m.StopReason = "tool_use"
			}
		}
		out += len(b.Text) + len(b.Thinking) + len(b.Name) + len(b.Input)
		m.Content = append(m.Content, b)
	}
	if m.StopReason == "" {
		m.StopReason = "end_turn"
	}
	if resp.Usage != nil {
		m.Usage = *resp.Usage
		if m.Usage.CacheCreation == nil {
			m.Usage.CacheCreation = &CacheCreation{Ephemeral5mInputTokens: m.Usage.CacheCreationInputTokens}
		} else {
			cc := *m.Usage.CacheCreation
			m.Usage.CacheCreation = &cc
		}
	} else {
		m.Usage = Usage{
			InputTokens:   req.InputTokens,
			CacheCreation: &CacheCreation{},
			OutputTokens:  estimateTokens(out),
		}
	}
	return m, nil
}

// The wire shapes below follow "Anthropic Messages streaming events" and
// the Message object of the Messages API.

// wireMessage is a Message object. Content is never null; StopReason is
// null in message_start.
type wireMessage struct {
	ID           string  `json:"id"`
	Type         string  `json:"type"` // "message"
	Role         string  `json:"role"` // "assistant"
	Model        string  `json:"model"`
	Content      []any   `json:"content"`
	StopReason   *string `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"` // always null here
	Usage        Usage   `json:"usage"`
}

// deltaUsage is message_delta's usage: cumulative counts, no TTL split.
type deltaUsage struct {
	OutputTokens             int `json:"output_tokens"`
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

type wireText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type wireToolUse struct {
	Type  string          `json:"type"`
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

type wireThinking struct {
	Type      string `json:"type"`
	Thinking  string `json:"thinking"`
	Signature string `json:"signature"`
}

// wireBlock renders a complete content block.
func wireBlock(b ContentBlock) any {
	switch b.Type {
	case "tool_use":
		return wireToolUse{Type: "tool_use", ID: b.ID, Name: b.Name, Input: b.Input}
	case "thinking":
		return wireThinking{Type: "thinking", Thinking: b.Thinking, Signature: b.Signature}
	}
	return wireText{Type: "text", Text: b.Text}
}

// nonStreamingJSON is the body of a non-streaming answer.
func (m *message) nonStreamingJSON() ([]byte, error) {
	content := make([]any, 0, len(m.Content))
	for _, b := range m.Content {
		content = append(content, wireBlock(b))
	}
	stop := m.StopReason
	return marshal(wireMessage{
		ID: m.ID, Type: "message", Role: "assistant", Model: m.Model,
		Content: content, StopReason: &stop, Usage: m.Usage,
	})
}

// event is one server-sent event: "event: <name>\ndata: <data>\n\n".
type event struct {
	name string
	data []byte
}

// Event payloads, with "type" first as Anthropic sends them.
type (
	typeOnly struct {
		Type string `json:"type"`
	}
	messageStartEvent struct {
		Type    string      `json:"type"`
		Message wireMessage `json:"message"`
	}
	blockStartEvent struct {
		Type         string `json:"type"`
		Index        int    `json:"index"`
		ContentBlock any    `json:"content_block"`
	}
	blockDeltaEvent struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
		Delta any    `json:"delta"`
	}
	blockStopEvent struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
	}
	messageDeltaEvent struct {
		Type  string       `json:"type"`
		Delta messageDelta `json:"delta"`
		Usage deltaUsage   `json:"usage"`
	}
	messageDelta struct {
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"` // always null here
	}
	textDelta struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	inputJSONDelta struct {
		Type        string `json:"type"`
		PartialJSON string `json:"partial_json"`
	}
	thinkingDelta struct {
		Type     string `json:"type"`
		Thinking string `json:"thinking"`
	}
	signatureDelta struct {
		Type      string `json:"type"`
		Signature string `json:"signature"`
	}
	thinkingStart struct {
		Type     string `json:"type"`
		Thinking string `json:"thinking"`
	}
)

// events renders m as the SSE sequence of a streaming answer:
// message_start, ping, per block content_block_start /
// content_block_delta… / content_block_stop, message_delta, message_stop.
// Text is split into up to 4 text_delta chunks, tool input into up to 3
// (at least 2) input_json_delta chunks, thinking into thinking_delta
// chunks followed by one signature_delta.
func (m *message) events() ([]event, error) {
	var evs []event
	var err error
	add := func(name string, v any) {
		if err != nil {
			return
		}
		var data []byte
		if data, err = marshal(v); err != nil {
			err = fmt.Errorf("marshal %s event: %w", name, err)
			return
		}
		evs = append(evs, event{name: name, data: data})
	}

	start := m.Usage
	start.OutputTokens = 1
	add("message_start", messageStartEvent{Type: "message_start", Message: wireMessage{
		ID: m.ID, Type: "message", Role: "assistant", Model: m.Model,
		Content: []any{}, Usage: start,
	}})
	add("ping", typeOnly{Type: "ping"})
	for i, b := range m.Content {
		var first any
		var deltas []any
		switch b.Type {
		case "tool_use":
			first = wireToolUse{Type: "tool_use", ID: b.ID, Name: b.Name, Input: json.RawMessage("{}")}
			for _, c := range splitChunks(string(b.Input), 3) {
				deltas = append(deltas, inputJSONDelta{Type: "input_json_delta", PartialJSON: c})
			}
		case "thinking":
			first = thinkingStart{Type: "thinking"}
			for _, c := range splitChunks(b.Thinking, 3) {
				deltas = append(deltas, thinkingDelta{Type: "thinking_delta", Thinking: c})
			}
			deltas = append(deltas, signatureDelta{Type: "signature_delta", Signature: b.Signature})
		default:
			first = wireText{Type: "text"}
			for _, c := range splitChunks(b.Text, 4) {
				deltas = append(deltas, textDelta{Type: "text_delta", Text: c})
			}
		}
		add("content_block_start", blockStartEvent{Type: "content_block_start", Index: i, ContentBlock: first})
		for _, d := range deltas {
			add("content_block_delta", blockDeltaEvent{Type: "content_block_delta", Index: i, Delta: d})
		}
		add("content_block_stop", blockStopEvent{Type: "content_block_stop", Index: i})
	}
	add("message_delta", messageDeltaEvent{
		Type:  "message_delta",
		Delta: messageDelta{StopReason: m.StopReason},
		Usage: deltaUsage{
			OutputTokens:             m.Usage.OutputTokens,
			InputTokens:              m.Usage.InputTokens,
			CacheCreationInputTokens: m.Usage.CacheCreationInputTokens,
			CacheReadInputTokens:     m.Usage.CacheReadInputTokens,
		},
	})
	add("message_stop", typeOnly{Type: "message_stop"})
	if err != nil {
		return nil, err
	}
	return evs, nil
}

// splitChunks cuts s into at most n pieces of about equal length, never
// inside a UTF-8 sequence, and into at least two pieces when s has two or
// more runes. The pieces concatenate to s. An empty s gives one empty
// piece, so every block gets at least one delta.
func splitChunks(s string, n int) []string {
	runes := utf8.RuneCountInString(s)
	if runes < 2 {
		return []string{s}
	}
	n = min(n, runes)
	size := (runes + n - 1) / n
	chunks := make([]string, 0, n)
	for len(s) > 0 {
		end, count := 0, 0
		for end < len(s) && count < size {
			_, w := utf8.DecodeRuneInString(s[end:])
			end += w
			count++
		}
		chunks = append(chunks, s[:end])
		s = s[end:]
	}
	return chunks
}

// marshal is json.Marshal without HTML escaping, so text such as "<b>"
// reads naturally in the stream; the output is equally valid JSON.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
