package anthropic

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

const streamBoth = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"claude-opus-5-5\",\"usage\":{\"input_tokens\":100,\"cache_creation_input_tokens\":50,\"cache_read_input_tokens\":10,\"cache_creation\":{\"ephemeral_5m_input_tokens\":20,\"ephemeral_1h_input_tokens\":30},\"output_tokens\":1}}}\n\n" +
	"event: ping\ndata: {\"type\":\"ping\"}\n\n" +
	"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"usage: {\\\"input_tokens\\\": 999}\"}}\n\n" +
	"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
	"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":100,\"cache_creation_input_tokens\":50,\"cache_read_input_tokens\":10,\"output_tokens\":42}}\n\n" +
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"

func TestStreamMeterAnyChunking(t *testing.T) {
	want := Usage{Model: "claude-opus-5-5", MessageID: "msg_1", InputTokens: 100, OutputTokens: 42,
		CacheCreationInputTokens: 50, CacheCreation5m: 20, CacheCreation1h: 30, CacheReadInputTokens: 10,
		Started: true, Finished: true, StopReason: "end_turn",
		DeltaOutputEstimate: 11} // one delta of 33 payload bytes
	for _, size := range []int{1, 2, 3, 7, 64, len(streamBoth)} {
		var m StreamMeter
		for s := streamBoth; len(s) > 0; {
			n := min(size, len(s))
			m.Write([]byte(s[:n]))
			s = s[n:]
		}
		if diff := cmp.Diff(want, m.Usage()); diff != "" {
			t.Errorf("chunk size %d (-want +got):\n%s", size, diff)
		}
	}
}

func TestStreamMeterUsageOnlyInDelta(t *testing.T) {
	s := "event: message_start\r\ndata: {\"message\":{\"id\":\"m\",\"model\":\"x\"}}\r\n\r\n" +
		"event: message_delta\r\ndata: {\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":7,\"output_tokens\":3}}\r\n\r\n"
	var m StreamMeter
	m.Write([]byte(s))
	u := m.Usage()
	if u.InputTokens != 7 || u.OutputTokens != 3 || u.Finished {
		t.Errorf("got %+v", u)
	}
}

func TestStreamMeterErrorEvent(t *testing.T) {
	s := "event: message_start\ndata: {\"message\":{\"id\":\"m\",\"model\":\"x\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n" +
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	var m StreamMeter
	m.Write([]byte(s))
	if u := m.Usage(); u.ErrorType != "overloaded_error" || u.InputTokens != 5 || u.Finished {
		t.Errorf("got %+v", u)
	}
}

func TestParseMessageUsage(t *testing.T) {
	u, ok := ParseMessageUsage([]byte(`{"type":"message","id":"m","model":"claude-haiku-5-5","stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":4,"cache_read_input_tokens":5,"inference_geo":"us"}}`))
	if !ok || u.InputTokens != 3 || u.OutputTokens != 4 || u.CacheReadInputTokens != 5 || !u.Finished || u.InferenceGeo != "us" {
		t.Errorf("message: got %+v, %v", u, ok)
	}
	u, ok = ParseMessageUsage([]byte(`{"type":"error","error":{"type":"rate_limit_error","message":"x"}}`))
	if !ok || u.ErrorType != "rate_limit_error" {
		t.Errorf("error: got %+v, %v", u, ok)
	}
}

func FuzzStreamMeter(f *testing.F) {
	f.Add([]byte(streamBoth))
	f.Add([]byte("event: message_delta\ndata: {\"usage\":null}\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m StreamMeter
		m.Write(b)
		_ = m.Usage()
	})
}

func TestStreamMeterInferenceGeo(t *testing.T) {
	var m StreamMeter
	m.Write([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"x\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1,\"inference_geo\":\"us\"}}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n"))
	if u := m.Usage(); u.InferenceGeo != "us" || u.OutputTokens != 7 {
		t.Errorf("got geo %q, output %d; want us, 7", u.InferenceGeo, u.OutputTokens)
	}
}
