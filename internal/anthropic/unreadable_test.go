package anthropic

import (
	"strings"
	"testing"
)

// streamHead is message_start and one text delta.
const streamHead = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"m\",\"usage\":{\"input_tokens\":5000,\"output_tokens\":1}}}\n\n" +
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hello\"}}\n\n"

const streamStop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"

func delta(data string) string { return "event: message_delta\ndata: " + data + "\n\n" }

// TestStreamMeterUnreadableFinalUsage: the last message_delta settles a
// stream; when its usage cannot be read the meter says why and keeps the
// last readable figures (never a negative count), whatever the chunking.
func TestStreamMeterUnreadableFinalUsage(t *testing.T) {
	good := delta(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":900}}`)
	for _, tc := range []struct {
		name, stream string
		final        bool
		why          string // a part of Unreadable; "" for none
		output       int64
	}{
		{"readable", streamHead + good + streamStop, true, "", 900},
		{"garbled", streamHead + delta(`{"usage":{"output_tokens":9`) + streamStop, false, "message_delta is not valid JSON", 1},
		{"not JSON", streamHead + delta(`<html>`) + streamStop, false, "message_delta is not valid JSON", 1},
		{"string count", streamHead + delta(`{"usage":{"output_tokens":"900"}}`) + streamStop, false, "usage.output_tokens has the wrong JSON type (string)", 1},
		{"fraction", streamHead + delta(`{"usage":{"output_tokens":1.5}}`) + streamStop, false, "usage.output_tokens has the wrong JSON type (number 1.5)", 1},
		{"negative", streamHead + delta(`{"usage":{"output_tokens":-900}}`) + streamStop, false, "usage.output_tokens is negative (-900)", 1},
		{"negative cache read", streamHead + delta(`{"usage":{"output_tokens":900,"cache_read_input_tokens":-1}}`) + streamStop, false, "negative", 1},
		{"negative searches", streamHead + delta(`{"usage":{"output_tokens":900,"server_tool_use":{"web_search_requests":-3}}}`) + streamStop, false, "negative", 1},
		{"no output_tokens", streamHead + delta(`{"usage":{"input_tokens":5000}}`) + streamStop, false, "no output_tokens", 1},
		{"no usage", streamHead + delta(`{"delta":{"stop_reason":"end_turn"}}`) + streamStop, false, "has no usage", 1},
		{"no data", streamHead + "event: message_delta\n\n" + streamStop, false, "without readable data", 1},
		{"readable then garbled", streamHead + good + delta(`{`) + streamStop, false, "not valid JSON", 900},
		{"garbled then readable", streamHead + delta(`{`) + good + streamStop, true, "", 900},
		{"cut inside the data line", streamHead + "event: message_delta\ndata: {\"usage\":{\"output_tok", false, "ended inside a message_delta", 1},
		{"cut after the event line", streamHead + "event: message_delta\n", false, "ended inside a message_delta", 1},
		{"no message_delta", streamHead + streamStop, false, "", 1},
		{"negative in message_start", strings.Replace(streamHead, `"input_tokens":5000`, `"input_tokens":-5000`, 1) + good + streamStop, true, "message_start usage.input_tokens is negative", 900},
	} {
		for _, size := range []int{1, 5, 64, len(tc.stream)} {
			var m StreamMeter
			for s := tc.stream; len(s) > 0; s = s[min(size, len(s)):] {
				m.Write([]byte(s[:min(size, len(s))]))
			}
			u, final := m.Ended()
			if final != tc.final || (tc.why == "") != (u.Unreadable == "") || !strings.Contains(u.Unreadable, tc.why) || u.OutputTokens != tc.output {
				t.Errorf("%s (chunks of %d): got final %v, Unreadable %q, output %d; want final %v, Unreadable with %q, output %d",
					tc.name, size, final, u.Unreadable, u.OutputTokens, tc.final, tc.why, tc.output)
			}
			if u.InputTokens < 0 || u.CacheReadInputTokens < 0 || u.WebSearchRequests < 0 {
				t.Errorf("%s: a negative count reached the usage: %+v", tc.name, u)
			}
		}
	}
}

func TestParseMessageUsageUnreadable(t *testing.T) {
	for body, why := range map[string]string{
		`{"type":"message","model":"m","usage":{"input_tokens":5}}`:                    "no output_tokens",
		`{"type":"message","model":"m","usage":{"input_tokens":5,"output_tokens":-1}}`: "negative",
		`{"type":"message","model":"m","usage":"5"}`:                                   "wrong JSON type",
		`{"type":"message","model":"m"}`:                                               "has no usage",
		`<html>`:                                                                       "not valid JSON",
	} {
		u, _ := ParseMessageUsage([]byte(body))
		if !strings.Contains(u.Unreadable, why) || u.Started || u.OutputTokens < 0 {
			t.Errorf("%s: got %+v, want Unreadable with %q and nothing started", body, u, why)
		}
	}
}

// FuzzStreamMeterEnded: whatever the stream, no count read is negative,
// an unreadable final usage is never final, and how the bytes are chunked
// does not change what Ended says.
func FuzzStreamMeterEnded(f *testing.F) {
	f.Add([]byte(streamHead+delta(`{"usage":{"output_tokens":9`)+streamStop), 3)
	f.Add([]byte(streamHead+delta(`{"usage":{"output_tokens":900}}`)+streamStop), 1)
	f.Add([]byte(streamHead+"event: message_delta\ndata: {\"usage\":{\"output_tok"), 7)
	f.Fuzz(func(t *testing.T, b []byte, size int) {
		size = max(1, size%97)
		var whole, chunked StreamMeter
		whole.Write(b)
		for s := b; len(s) > 0; s = s[min(size, len(s)):] {
			chunked.Write(s[:min(size, len(s))])
		}
		u, final := whole.Ended()
		cu, cfinal := chunked.Ended()
		// DeltaOutputEstimate may differ for a content line that does not
		// start "data:" (whether it is skipped depends on its first
		// chunk): an estimate, not a count read.
		u.DeltaOutputEstimate, cu.DeltaOutputEstimate = 0, 0
		if u != cu || final != cfinal {
			t.Fatalf("chunks of %d change the result: whole %+v %v, chunked %+v %v", size, u, final, cu, cfinal)
		}
		if final && u.Unreadable != "" && u.Unreadable != whole.startWhy {
			t.Fatalf("final with Unreadable %q", u.Unreadable)
		}
		if u.InputTokens < 0 || u.OutputTokens < 0 || u.CacheCreationInputTokens < 0 || u.CacheReadInputTokens < 0 ||
			u.CacheCreation5m < 0 || u.CacheCreation1h < 0 || u.WebSearchRequests < 0 || u.WebFetchRequests < 0 {
			t.Fatalf("a negative count: %+v", u)
		}
	})
}
