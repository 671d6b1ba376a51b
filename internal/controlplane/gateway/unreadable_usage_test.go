package gateway_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// Issue 28 item 5, unreadable usage: a malformed final usage frame after a
// long answer was booked as complete with the one output token
// message_start reports (about 5 % of what was due), although the docs say
// usage the gateway cannot read books the reservation.

// longAnswerDeltas is how many text deltas the long answer streams (about
// 36 000 bytes of text: some 9 000 output tokens, billed 0.135 USD on
// Sonnet 4.5).
const longAnswerDeltas = 300

// longAnswerStart is message_start, then a text block of longAnswerDeltas
// deltas, as the Messages API streams it.
func longAnswerStart() string {
	var b strings.Builder
	fmt.Fprintf(&b, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_long\",\"type\":\"message\",\"role\":\"assistant\","+
		"\"model\":%q,\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":5000,\"output_tokens\":1}}}\n\n", model)
	b.WriteString("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
	b.WriteString("event: ping\ndata: {\"type\": \"ping\"}\n\n")
	chunk := strings.Repeat("lorem ipsum dolor sit amet ", 4) + "consectetur adipiscing elit, sed do "
	for range longAnswerDeltas {
		fmt.Fprintf(&b, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":%q}}\n\n", chunk)
	}
	b.WriteString("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n")
	return b.String()
}

// messageDelta is a message_delta event whose data is data, verbatim.
func messageDelta(data string) string { return "event: message_delta\ndata: " + data + "\n\n" }

const (
	messageStop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	// goodDelta is the final usage the upstream meant to send.
	goodDelta = `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":9000}}`
)

// rawAnswer is an upstream that answers with body, verbatim: an SSE stream
// (stream) or a JSON message. With abort, the connection is cut after body
// (no end of the chunked body: the gateway reads an error). Each answer
// gets its own request-id header, req_up_1, req_up_2, ...
type rawAnswer struct {
	body   string
	stream bool
	abort  bool
	n      *atomic.Int32
}

func (a rawAnswer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Request-Id", fmt.Sprintf("req_up_%d", a.n.Add(1)))
	if a.stream {
		w.Header().Set("Content-Type", "text/event-stream")
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, a.body)
	w.(http.Flusher).Flush()
	if a.abort {
		panic(http.ErrAbortHandler)
	}
}

// switchUpstream passes each request to the handler current holds.
type switchUpstream struct{ current atomic.Pointer[http.Handler] }

func (s *switchUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*s.current.Load()).ServeHTTP(w, r)
}

func (s *switchUpstream) set(h http.Handler) { s.current.Store(&h) }

// TestGatewayBooksReservationWhenUsageUnreadable guards against a malformed
// final usage frame after a long answer being booked as complete with one
// output token: whenever the usage that settles a call cannot be read (a
// final message_delta that is garbled, of the wrong shape, negative,
// without output_tokens, cut part-way or missing; a JSON answer whose
// usage is unusable), the call is booked at its full reservation (outcome
// unmetered), never at the last partial or default figure, and a WARN line
// names the call and why. Control cases whose final usage is readable are
// booked at it.
func TestGatewayBooksReservationWhenUsageUnreadable(t *testing.T) {
	start := longAnswerStart()
	jsonMessage := func(usage string) string {
		return fmt.Sprintf(`{"id":"msg_long","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"%s"}],`+
			`"stop_reason":"end_turn","stop_sequence":null,"usage":%s}`, model, strings.Repeat("lorem ipsum ", 3000), usage)
	}
	unreadable := []struct {
		name   string
		body   string
		stream bool
		abort  bool
	}{
		{name: "garbled message_delta JSON", stream: true,
			body: start + messageDelta(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":90`) + messageStop},
		{name: "output_tokens a string", stream: true,
			body: start + messageDelta(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":"9000"}}`) + messageStop},
		{name: "output_tokens a fraction", stream: true,
			body: start + messageDelta(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":9000.5}}`) + messageStop},
		{name: "usage an array", stream: true,
			body: start + messageDelta(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":[9000]}`) + messageStop},
		{name: "negative output_tokens", stream: true,
			body: start + messageDelta(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":-9000}}`) + messageStop},
		{name: "negative input_tokens", stream: true,
			body: start + messageDelta(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":-5000,"output_tokens":9000}}`) + messageStop},
		{name: "missing output_tokens after message_start's input", stream: true,
			body: start + messageDelta(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":5000}}`) + messageStop},
		{name: "output_tokens null", stream: true,
			body: start + messageDelta(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":null}}`) + messageStop},
		{name: "message_delta without usage", stream: true,
			body: start + messageDelta(`{"type":"message_delta","delta":{"stop_reason":"end_turn"}}`) + messageStop},
		{name: "non-JSON frame where the usage should be", stream: true,
			body: start + messageDelta(`<html><body>502 Bad Gateway</body></html>`) + messageStop},
		{name: "readable usage replaced by a garbled one", stream: true,
			body: start + messageDelta(goodDelta) + messageDelta(`{"type":"message_delta","usage":{"output_tok`) + messageStop},
		{name: "message_stop without message_delta", stream: true,
			body: start + messageStop},
		{name: "truncated after the long content (clean end)", stream: true,
			body: start},
		{name: "cut inside the final message_delta", stream: true, abort: true,
			body: start + "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_to"},
		{name: "JSON answer without output_tokens",
			body: jsonMessage(`{"input_tokens":5000}`)},
		{name: "JSON answer with negative output_tokens",
			body: jsonMessage(`{"input_tokens":5000,"output_tokens":-1}`)},
		{name: "JSON answer with usage a string",
			body: jsonMessage(`"9000"`)},
	}
	readable := []struct {
		name         string
		body         string
		input, outpt int64
	}{
		{name: "readable final usage", body: start + messageDelta(goodDelta) + messageStop, input: 5000, outpt: 9000},
		{name: "garbled message_delta replaced by a readable one", input: 5000, outpt: 9000,
			body: start + messageDelta(`{"type":"message_delta","usage":{"output_tok`) + messageDelta(goodDelta) + messageStop},
	}

	up := &switchUpstream{}
	f := newFixtureWith(t, fixtureOptions{upstream: up})
	var ids atomic.Int32
	for i, tc := range unreadable {
		t.Run(tc.name, func(t *testing.T) {
			user := fmt.Sprintf("unreadable-%d", i)
			up.set(rawAnswer{body: tc.body, stream: tc.stream, abort: tc.abort, n: &ids})
			req := f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, user), strings.NewReader(messagesBody(tc.stream, 16000)))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body) // a cut stream ends in an error here: that is the point
			resp.Body.Close()
			upstreamID := fmt.Sprintf("req_up_%d", ids.Load())
			l := f.waitSettled(t, user, 1)
			if len(l) != 2 || l[0].Kind != "reserve" || l[1].Kind != "debit" {
				t.Fatalf("ledger: got %+v, want a reserve and a debit", l)
			}
			if d := l[1]; d.Amount != l[0].Amount || d.Outcome != "unmetered" {
				t.Errorf("debit: got %d nano-USD (%s, %d output tokens), want the reservation %d (unmetered)",
					d.Amount, d.Outcome, d.OutputTokens, l[0].Amount)
			}
			if sp := f.spend(t, user); sp.Spent != l[0].Amount {
				t.Errorf("spent: got %d, want the reservation %d", sp.Spent, l[0].Amount)
			}
			line := logLine(f.logs.String(), "level=WARN", upstreamID)
			if !strings.Contains(line, "user="+user) || !strings.Contains(line, "reason=") || !strings.Contains(line, "charging the reservation") {
				t.Errorf("log: got %q for %s, want a WARN line naming the call (user, request ids) and the reason, charging the reservation\n%s",
					line, upstreamID, f.logs.String())
			}
			_, reason, _ := strings.Cut(line, "reason=")
			t.Logf("booked %d nano-USD; reason=%s", l[1].Amount, reason)
		})
	}
	for i, tc := range readable {
		t.Run(tc.name, func(t *testing.T) {
			user := fmt.Sprintf("readable-%d", i)
			up.set(rawAnswer{body: tc.body, stream: true, n: &ids})
			got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, user), strings.NewReader(messagesBody(true, 16000))))
			if got.status != http.StatusOK || string(got.body) != tc.body {
				t.Fatalf("got %d and %d bytes, want 200 and the upstream's %d bytes unchanged", got.status, len(got.body), len(tc.body))
			}
			l := f.waitSettled(t, user, 1)
			d := l[len(l)-1]
			if d.Outcome != "complete" || d.InputTokens != tc.input || d.OutputTokens != tc.outpt || d.Amount >= l[0].Amount {
				t.Errorf("debit: got %+v, want complete with %d input and %d output tokens, below the reservation %d", d, tc.input, tc.outpt, l[0].Amount)
			}
		})
	}
}

// logLine returns the first log line that mentions every one of subs, or "".
func logLine(logs string, subs ...string) string {
next:
	for line := range strings.Lines(logs) {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		return strings.TrimSpace(line)
	}
	return ""
}
