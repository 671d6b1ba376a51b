package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Usage is the token usage of one Messages call, by kind, as billed.
type Usage struct {
	// Model is the model named in the response (prices go by it).
	Model string
	// MessageID is the response message id ("msg_...").
	MessageID string
	// InputTokens are uncached input tokens.
	InputTokens int64
	// OutputTokens are output tokens, thinking included.
	OutputTokens int64
	// CacheCreationInputTokens are tokens written to the prompt cache.
	CacheCreationInputTokens int64
	// CacheCreation5m and CacheCreation1h split the cache writes by TTL when
	// the response says so (message_start only).
	CacheCreation5m int64
	CacheCreation1h int64
	// CacheReadInputTokens are tokens read from the prompt cache.
	CacheReadInputTokens int64
	// WebSearchRequests and WebFetchRequests count server-tool requests
	// (usage.server_tool_use), billed per request.
	WebSearchRequests int64
	WebFetchRequests  int64
	// InferenceGeo is usage.inference_geo: where the call ran ("us", or
	// "global"/empty for anywhere); some geos cost more.
	InferenceGeo string
	// DeltaOutputEstimate is an over-estimate of the output tokens delivered
	// in content_block_delta events so far (at least one per event, about
	// one per 3 bytes of delta payload). It prices a stream that ended
	// before its final message_delta; see BilledOutputTokens.
	DeltaOutputEstimate int64
	// Started is true once message_start (or a JSON message) was seen;
	// Finished once message_stop was seen (a whole JSON answer with
	// usage: at once).
	Started, Finished bool
	StopReason        string
	// ErrorType is the error.type of an "error" event or error body, if any.
	ErrorType string
	// Unreadable says why the usage that settles the call could not be
	// read, and is empty when it was (or has not come yet): the last
	// message_delta, or a JSON message, is not valid JSON, has no usage or
	// no output_tokens, or has a count of the wrong JSON type or below
	// zero; message_start has a count below zero; a stream was cut inside
	// a message_delta event (StreamMeter.Ended). The counts above then
	// hold the last readable figures, which do not settle the call (the
	// gateway books it at its reservation).
	Unreadable string
}

type wireUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	CacheCreation            *struct {
		Ephemeral5m int64 `json:"ephemeral_5m_input_tokens"`
		Ephemeral1h int64 `json:"ephemeral_1h_input_tokens"`
	} `json:"cache_creation"`
	ServerToolUse *struct {
		WebSearchRequests *int64 `json:"web_search_requests"`
		WebFetchRequests  *int64 `json:"web_fetch_requests"`
	} `json:"server_tool_use"`
	InferenceGeo *string `json:"inference_geo"`
}

// check returns why w cannot settle a call, or "": a count that is
// negative, or (needOutput) output_tokens missing or null. what names the
// event for the reason.
func (w *wireUsage) check(what string, needOutput bool) string {
	if w == nil {
		return what + " has no usage"
	}
	if needOutput && w.OutputTokens == nil {
		return what + " usage has no output_tokens"
	}
	for _, f := range []struct {
		name string
		n    *int64
	}{
		{"input_tokens", w.InputTokens}, {"output_tokens", w.OutputTokens},
		{"cache_creation_input_tokens", w.CacheCreationInputTokens}, {"cache_read_input_tokens", w.CacheReadInputTokens},
	} {
		if f.n != nil && *f.n < 0 {
			return fmt.Sprintf("%s usage.%s is negative (%d)", what, f.name, *f.n)
		}
	}
	if cc := w.CacheCreation; cc != nil && (cc.Ephemeral5m < 0 || cc.Ephemeral1h < 0) {
		return what + " usage.cache_creation has a negative count"
	}
	if st := w.ServerToolUse; st != nil && (st.WebSearchRequests != nil && *st.WebSearchRequests < 0 || st.WebFetchRequests != nil && *st.WebFetchRequests < 0) {
		return what + " usage.server_tool_use has a negative count"
	}
	return ""
}

// unreadable describes err, the failure to decode what's JSON, in JSON's
// terms (a member of the wrong type, or not JSON at all).
func unreadable(what string, err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return fmt.Sprintf("%s member %s has the wrong JSON type (%s)", what, te.Field, te.Value)
	}
	return what + " is not valid JSON"
}

// BilledOutputTokens is the output to bill: the reported count once the
// final message_delta came (complete), else the larger of the reported
// count and DeltaOutputEstimate (a stream cut, failed or abandoned
// part-way: Anthropic bills what it generated, and the gateway only knows
// what it delivered).
func (u Usage) BilledOutputTokens(complete bool) int64 {
	if complete {
		return u.OutputTokens
	}
	return max(u.OutputTokens, u.DeltaOutputEstimate)
}

// TotalTokens is every token of the call: input, cache writes, cache reads
// and output.
func (u Usage) TotalTokens() int64 {
	return u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens + u.OutputTokens
}

// apply sets (never adds) each field the wire usage carries: Anthropic's
// message_delta usage is cumulative, and some compatible servers send usage
// only there.
func (u *Usage) apply(w *wireUsage) {
	if w == nil {
		return
	}
	if w.InputTokens != nil {
		u.InputTokens = *w.InputTokens
	}
	if w.OutputTokens != nil {
		u.OutputTokens = *w.OutputTokens
	}
	if w.CacheCreationInputTokens != nil {
		u.CacheCreationInputTokens = *w.CacheCreationInputTokens
	}
	if w.CacheReadInputTokens != nil {
		u.CacheReadInputTokens = *w.CacheReadInputTokens
	}
	if w.CacheCreation != nil {
		u.CacheCreation5m = w.CacheCreation.Ephemeral5m
		u.CacheCreation1h = w.CacheCreation.Ephemeral1h
	}
	if w.InferenceGeo != nil {
		u.InferenceGeo = *w.InferenceGeo
	}
	if st := w.ServerToolUse; st != nil {
		if st.WebSearchRequests != nil {
			u.WebSearchRequests = *st.WebSearchRequests
		}
		if st.WebFetchRequests != nil {
			u.WebFetchRequests = *st.WebFetchRequests
		}
	}
}

// StreamMeter reads usage from a copy of a Messages SSE stream (Anthropic
// Messages streaming events) without altering it: write every byte of the
// stream to it, in order, in chunks of any size, then call Ended. Only
// message_start, message_delta, message_stop and error events are decoded;
// content deltas are skipped unparsed. message_delta usage is cumulative,
// so the last message_delta settles the call: one that cannot be read sets
// Usage.Unreadable (and its figures are not taken), a later readable one
// clears it. Write never fails. Not safe for concurrent use.
type StreamMeter struct {
	usage Usage
	// final is set while the last message_delta's usage was read: the
	// figure that settles the call.
	final bool
	// deltaOpen is set from a message_delta event line until its data line
	// was read: a stream that ends meanwhile was cut inside it.
	deltaOpen bool
	// startWhy is why message_start's usage could not be read, if so.
	startWhy string
	// line holds the current unterminated line when it may matter.
	line []byte
	// skipping is true while the rest of the current line is irrelevant.
	skipping bool
	// event is the current SSE event name.
	event string
	// skipped counts the bytes of the content_block_delta data line being
	// skipped, for DeltaOutputEstimate.
	skipped int
}

// deltaEnvelope is the size of a content_block_delta data line around its
// payload: `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":""}}`.
const deltaEnvelope = 84

// maxMeterLine bounds a line the meter buffers (usage events are small).
const maxMeterLine = 1 << 20

// Write consumes stream bytes.
func (m *StreamMeter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if !m.skipping {
			if len(m.line) == 0 && m.event != "" && !interesting(m.event) && bytes.HasPrefix(chunk, []byte("data")) {
				m.skipping = true // a content delta: do not buffer it
				m.skipped = 0
			} else if len(m.line)+len(chunk) > maxMeterLine {
				m.skipping = true
				m.skipped = len(m.line)
				m.line = m.line[:0]
			} else {
				m.line = append(m.line, chunk...)
			}
		}
		if m.skipping {
			m.skipped += len(chunk)
		}
		// The line's end: m.line holds it whole, or it was skipped
		// (m.skipped bytes long).
		if i < 0 {
			break
		}
		if !m.skipping {
			m.handleLine(bytes.TrimSuffix(m.line, []byte("\r")))
		} else if m.event == "content_block_delta" {
			m.countDelta(m.skipped)
		}
		m.line = m.line[:0]
		m.skipping = false
		p = p[i+1:]
	}
	return n, nil
}

func interesting(event string) bool {
	switch event {
	case "message_start", "message_delta", "message_stop", "error":
		return true
	}
	return false
}

func (m *StreamMeter) handleLine(line []byte) {
	switch {
	case len(line) == 0:
		if m.deltaOpen {
			// The event ended without data the meter could read (none,
			// or a line over maxMeterLine).
			m.deltaOpen, m.final = false, false
			m.usage.Unreadable = "message_delta event without readable data"
		}
		m.event = ""
	case bytes.HasPrefix(line, []byte("event:")):
		m.event = string(bytes.TrimSpace(line[len("event:"):]))
		m.deltaOpen = m.event == "message_delta"
	case bytes.HasPrefix(line, []byte("data:")):
		m.handleData(bytes.TrimSpace(line[len("data:"):]))
	}
}

// countDelta adds the output estimate of one content_block_delta data line
// of n bytes.
func (m *StreamMeter) countDelta(n int) {
	m.usage.DeltaOutputEstimate += max(1, int64(n-deltaEnvelope+2)/3)
}

func (m *StreamMeter) handleData(data []byte) {
	switch m.event {
	case "content_block_delta":
		m.countDelta(len(data) + len("data: "))
	case "message_start":
		var v struct {
			Message struct {
				ID    string     `json:"id"`
				Model string     `json:"model"`
				Usage *wireUsage `json:"usage"`
			} `json:"message"`
		}
		if json.Unmarshal(data, &v) == nil {
			m.usage.Started = true
			m.usage.MessageID = v.Message.ID
			if v.Message.Model != "" {
				m.usage.Model = v.Message.Model
			}
			// Usage here is optional (some servers send it only on the
			// delta), but counts that are there must be counts; a delta
			// read later does not make up for them.
			if w := v.Message.Usage; w != nil {
				if m.startWhy = w.check("message_start", false); m.startWhy != "" {
					m.usage.Unreadable = m.startWhy
				} else {
					m.usage.apply(w)
				}
			}
		}
	case "message_delta":
		m.deltaOpen = false
		var v struct {
			Delta struct {
				StopReason *string `json:"stop_reason"`
			} `json:"delta"`
			Usage *wireUsage `json:"usage"`
		}
		why := ""
		if err := json.Unmarshal(data, &v); err != nil {
			why = unreadable("message_delta", err)
		} else {
			why = v.Usage.check("message_delta", true)
		}
		if why != "" {
			m.usage.Unreadable, m.final = why, false
			return
		}
		m.usage.apply(v.Usage)
		m.usage.Unreadable, m.final = m.startWhy, true
		if v.Delta.StopReason != nil {
			m.usage.StopReason = *v.Delta.StopReason
		}
	case "message_stop":
		m.usage.Finished = true
	case "error":
		var v struct {
			Error struct {
				Type string `json:"type"`
			} `json:"error"`
		}
		if json.Unmarshal(data, &v) == nil {
			m.usage.ErrorType = v.Error.Type
		}
	}
}

// Usage returns what the stream said so far.
func (m *StreamMeter) Usage() Usage { return m.usage }

// Ended returns the usage once every byte of the stream was written (it
// ended, or was cut): Usage, with Unreadable set when the stream was cut
// inside a message_delta event. final reports whether the usage that
// settles the call came and was read: a message_delta whose usage was
// read, with no unreadable one after it. A stream whose final is false
// and whose Unreadable is empty had no message_delta at all.
func (m *StreamMeter) Ended() (u Usage, final bool) {
	u = m.usage
	if m.deltaOpen {
		u.Unreadable = "the stream ended inside a message_delta event"
		return u, false
	}
	return u, m.final
}

// Started reports whether message_start was seen: the input-side usage is
// known from then on.
func (m *StreamMeter) Started() bool { return m.usage.Started }

// ParseMessageUsage reads usage from a non-streaming Messages response body
// (a Message object) or an error envelope. ok is false when body is not a
// JSON object of either kind; the Usage's Unreadable then says why. A
// message whose usage cannot settle the call (missing, no output_tokens, a
// count of the wrong type or negative) has Unreadable set and Started
// unset.
func ParseMessageUsage(body []byte) (u Usage, ok bool) {
	var v struct {
		Type       string     `json:"type"`
		ID         string     `json:"id"`
		Model      string     `json:"model"`
		StopReason string     `json:"stop_reason"`
		Usage      *wireUsage `json:"usage"`
		Error      struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return Usage{Unreadable: unreadable("the answer", err)}, false
	}
	u = Usage{Model: v.Model, MessageID: v.ID, StopReason: v.StopReason}
	if v.Type == "error" {
		u.ErrorType = v.Error.Type
		return u, true
	}
	if why := v.Usage.check("the answer", true); why != "" {
		u.Unreadable = why
		return u, true
	}
	u.apply(v.Usage)
	u.Started = v.Usage != nil
	u.Finished = u.Started
	return u, true
}
