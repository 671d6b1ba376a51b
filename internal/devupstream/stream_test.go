package devupstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestStreamWireFormat(t *testing.T) {
	s, ts := newTestServer(t, Config{})
	const text = "Hello, wörld! Let me look at the repository."
	s.Script(Response{Content: []ContentBlock{
		Text(text),
		{Type: "tool_use", ID: "toolu_fixed", Name: "Bash", Input: json.RawMessage(`{"command": "ls -la", "description": "List files"}`)},
	}})

	resp, body := do(t, http.MethodPost, ts.URL+"/v1/messages?beta=true", simpleBody("hi", true), cliHeaders("tok"))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got status %d, want 200: %s", resp.StatusCode, body)
	}
	for k, want := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache"} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("header %s: got %q, want %q", k, got, want)
		}
	}
	if got := resp.Header.Get("request-id"); !strings.HasPrefix(got, "req_dev_") {
		t.Errorf("request-id: got %q, want req_dev_…", got)
	}
	if !bytes.HasPrefix(body, []byte("event: message_start\ndata: {")) {
		t.Errorf("body starts %q, want the event:/data: framing", body[:min(len(body), 40)])
	}

	evs, err := parseSSE(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse SSE: %v", err)
	}
	wantNames := []string{
		"message_start", "ping",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop",
		"message_delta", "message_stop",
	}
	if diff := cmp.Diff(wantNames, names(evs)); diff != "" {
		t.Fatalf("event sequence (-want +got):\n%s", diff)
	}

	a := assemble(t, evs)
	if id, _ := a.Start["id"].(string); !strings.HasPrefix(id, "msg_dev_") {
		t.Errorf("message id: got %q, want msg_dev_…", id)
	}
	startWant := map[string]any{"type": "message", "role": "assistant", "model": "claude-opus-5-5", "content": []any{}, "stop_reason": nil, "stop_sequence": nil}
	for k, want := range startWant {
		got, ok := a.Start[k]
		if !ok {
			t.Errorf("message_start.message.%s missing", k)
			continue
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("message_start.message.%s (-want +got):\n%s", k, diff)
		}
	}
	usage, _ := a.Start["usage"].(map[string]any)
	for _, k := range []string{"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "cache_creation", "output_tokens"} {
		if _, ok := usage[k]; !ok {
			t.Errorf("message_start usage.%s missing: %v", k, usage)
		}
	}
	if diff := cmp.Diff(map[string]any{"ephemeral_5m_input_tokens": 0.0, "ephemeral_1h_input_tokens": 0.0}, usage["cache_creation"]); diff != "" {
		t.Errorf("message_start usage.cache_creation (-want +got):\n%s", diff)
	}
	if got := usage["output_tokens"]; got != 1.0 {
		t.Errorf("message_start output_tokens: got %v, want 1", got)
	}
	if got, _ := usage["input_tokens"].(float64); got < 1 {
		t.Errorf("message_start input_tokens: got %v, want ≥1", got)
	}

	wantContent := []map[string]any{
		{"type": "text", "text": text},
		{"type": "tool_use", "id": "toolu_fixed", "name": "Bash", "input": map[string]any{"command": "ls -la", "description": "List files"}},
	}
	if diff := cmp.Diff(wantContent, a.Content); diff != "" {
		t.Errorf("rebuilt content (-want +got):\n%s", diff)
	}
	if a.StopReason != "tool_use" {
		t.Errorf("stop_reason: got %v, want tool_use", a.StopReason)
	}
	for _, k := range []string{"output_tokens", "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"} {
		if _, ok := a.DeltaUsage[k]; !ok {
			t.Errorf("message_delta usage.%s missing: %v", k, a.DeltaUsage)
		}
	}
	if a.DeltaUsage["input_tokens"] != usage["input_tokens"] {
		t.Errorf("message_delta input_tokens %v, want the message_start value %v", a.DeltaUsage["input_tokens"], usage["input_tokens"])
	}
	if got, _ := a.DeltaUsage["output_tokens"].(float64); got < 1 {
		t.Errorf("message_delta output_tokens: got %v, want ≥1", got)
	}

	// The tool_use start block carries an empty input; the JSON comes in
	// at least two partial_json chunks.
	if diff := cmp.Diff(`{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_fixed","name":"Bash","input":{}}}`, evs[8].Data); diff != "" {
		t.Errorf("tool_use content_block_start (-want +got):\n%s", diff)
	}
}

// TestStreamMatchesNonStreaming checks that both forms of the same answer
// carry the same content, stop reason and usage.
func TestStreamMatchesNonStreaming(t *testing.T) {
	s, ts := newTestServer(t, Config{})
	r := Response{
		Content: []ContentBlock{
			{Type: "thinking", Thinking: "Let me think about <this>.", Signature: "sig123"},
			Text("Done & dusted."),
			ToolUse("mcp__x__y", map[string]any{"n": 1, "s": "日本語"}),
		},
		StopReason: "tool_use",
		Usage: &Usage{InputTokens: 3, CacheCreationInputTokens: 100, CacheReadInputTokens: 2000, OutputTokens: 42,
			CacheCreation: &CacheCreation{Ephemeral5mInputTokens: 40, Ephemeral1hInputTokens: 60}},
	}
	r.Content[2].ID = "toolu_same"
	s.Script(r, r)

	_, body := do(t, http.MethodPost, ts.URL+"/v1/messages", simpleBody("hi", true), nil)
	evs, err := parseSSE(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	a := assemble(t, evs)

	resp, body := do(t, http.MethodPost, ts.URL+"/v1/messages", simpleBody("hi", false), nil)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("non-streaming Content-Type: got %q, want application/json", ct)
	}
	whole := decodeJSON(t, string(body))

	var content []map[string]any
	for _, c := range whole["content"].([]any) {
		content = append(content, c.(map[string]any))
	}
	if diff := cmp.Diff(content, a.Content); diff != "" {
		t.Errorf("streamed content differs from non-streaming (-whole +stream):\n%s", diff)
	}
	if a.StopReason != whole["stop_reason"] {
		t.Errorf("stop_reason: stream %v, whole %v", a.StopReason, whole["stop_reason"])
	}
	wantUsage := map[string]any{
		"input_tokens": 3.0, "cache_creation_input_tokens": 100.0, "cache_read_input_tokens": 2000.0, "output_tokens": 42.0,
		"cache_creation": map[string]any{"ephemeral_5m_input_tokens": 40.0, "ephemeral_1h_input_tokens": 60.0},
	}
	if diff := cmp.Diff(wantUsage, whole["usage"]); diff != "" {
		t.Errorf("non-streaming usage (-want +got):\n%s", diff)
	}
	startUsage := a.Start["usage"].(map[string]any)
	wantStart := map[string]any{
		"input_tokens": 3.0, "cache_creation_input_tokens": 100.0, "cache_read_input_tokens": 2000.0, "output_tokens": 1.0,
		"cache_creation": map[string]any{"ephemeral_5m_input_tokens": 40.0, "ephemeral_1h_input_tokens": 60.0},
	}
	if diff := cmp.Diff(wantStart, startUsage); diff != "" {
		t.Errorf("message_start usage (-want +got):\n%s", diff)
	}
	wantDelta := map[string]any{"input_tokens": 3.0, "cache_creation_input_tokens": 100.0, "cache_read_input_tokens": 2000.0, "output_tokens": 42.0}
	if diff := cmp.Diff(wantDelta, a.DeltaUsage); diff != "" {
		t.Errorf("message_delta usage (-want +got):\n%s", diff)
	}
}

func TestNonStreamingShape(t *testing.T) {
	_, ts := newTestServer(t, Config{})
	resp, body := do(t, http.MethodPost, ts.URL+"/v1/messages", simpleBody("hello there", false), nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got status %d, want 200: %s", resp.StatusCode, body)
	}
	m := decodeJSON(t, string(body))
	id, _ := m["id"].(string)
	if !strings.HasPrefix(id, "msg_dev_") {
		t.Errorf("id: got %q, want msg_dev_…", id)
	}
	delete(m, "id")
	usage, _ := m["usage"].(map[string]any)
	delete(m, "usage")
	want := map[string]any{
		"type": "message", "role": "assistant", "model": ModelID,
		"content":     []any{map[string]any{"type": "text", "text": `You said: "hello there". I am the TalkIDE development upstream; put a command between backticks and I will run it.`}},
		"stop_reason": "end_turn", "stop_sequence": nil,
	}
	if diff := cmp.Diff(want, m); diff != "" {
		t.Errorf("message (-want +got):\n%s", diff)
	}
	for _, k := range []string{"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "cache_creation", "output_tokens"} {
		if _, ok := usage[k]; !ok {
			t.Errorf("usage.%s missing: %v", k, usage)
		}
	}
	if got := usage["output_tokens"].(float64); got < 2 {
		t.Errorf("output_tokens: got %v, want an estimate of the ~100-byte text", got)
	}
}

func TestTokenEstimatesAreDeterministic(t *testing.T) {
	_, ts := newTestServer(t, Config{})
	body := simpleBody("count me", true)
	var first []string
	for range 2 {
		_, b := do(t, http.MethodPost, ts.URL+"/v1/messages", body, nil)
		evs, err := parseSSE(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		a := assemble(t, evs)
		got := []string{string(mustJSON(t, a.Start["usage"])), string(mustJSON(t, a.DeltaUsage))}
		if first == nil {
			first = got
		} else if diff := cmp.Diff(first, got); diff != "" {
			t.Errorf("usage changed between identical calls (-first +second):\n%s", diff)
		}
	}
	// messages+system+tools raw JSON bytes / 4.
	var top struct {
		Messages json.RawMessage `json:"messages"`
		Tools    json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal([]byte(body), &top); err != nil {
		t.Fatal(err)
	}
	_, b := do(t, http.MethodPost, ts.URL+"/v1/messages/count_tokens", body, nil)
	want := (len(top.Messages) + len(top.Tools)) / 4
	if diff := cmp.Diff(map[string]any{"input_tokens": float64(want)}, decodeJSON(t, string(b))); diff != "" {
		t.Errorf("count_tokens (-want +got):\n%s", diff)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestStreamErrorEventAfter200(t *testing.T) {
	s, ts := newTestServer(t, Config{})
	s.Script(Response{Content: []ContentBlock{Text("never seen")}, StreamError: &StreamError{AfterEvents: 1}})

	resp, body := do(t, http.MethodPost, ts.URL+"/v1/messages", simpleBody("hi", true), nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got status %d, want 200", resp.StatusCode)
	}
	evs, err := parseSSE(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("stream did not end cleanly: %v", err)
	}
	if diff := cmp.Diff([]string{"message_start", "error"}, names(evs)); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, evs[1].Data); diff != "" {
		t.Errorf("error event (-want +got):\n%s", diff)
	}
}

func TestStreamErrorNonStreamingBecomesStatus(t *testing.T) {
	s, ts := newTestServer(t, Config{})
	s.Script(Response{StreamError: &StreamError{AfterEvents: 3}})
	resp, body := do(t, http.MethodPost, ts.URL+"/v1/messages", simpleBody("hi", false), nil)
	if resp.StatusCode != 529 {
		t.Errorf("got status %d, want 529", resp.StatusCode)
	}
	e := decodeJSON(t, string(body))["error"].(map[string]any)
	if e["type"] != "overloaded_error" {
		t.Errorf("error type: got %v, want overloaded_error", e["type"])
	}
}

func TestStreamCutConnection(t *testing.T) {
	s, ts := newTestServer(t, Config{})
	s.Script(Response{Content: []ContentBlock{Text("partial answer that is cut")}, Cut: &Cut{AfterEvents: 4}})

	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, ts.URL+"/v1/messages", strings.NewReader(simpleBody("hi", true)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got status %d, want 200 before the cut", resp.StatusCode)
	}
	evs, err := parseSSE(resp.Body)
	if err == nil {
		t.Fatalf("stream ended cleanly, want a broken connection")
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Logf("read error (any is fine): %v", err)
	}
	if diff := cmp.Diff([]string{"message_start", "ping", "content_block_start", "content_block_delta"}, names(evs)); diff != "" {
		t.Errorf("events before the cut (-want +got):\n%s", diff)
	}

	// The server keeps serving after a cut.
	resp2, _ := do(t, http.MethodGet, ts.URL+"/api/hello", "", nil)
	if resp2.StatusCode != http.StatusOK {
		t.Errorf("after cut: got status %d, want 200", resp2.StatusCode)
	}
}

func TestCutNonStreamingDropsConnection(t *testing.T) {
	s, ts := newTestServer(t, Config{})
	s.Script(Response{Cut: &Cut{}})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, ts.URL+"/v1/messages", strings.NewReader(simpleBody("hi", false)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got status %d, want a transport error", resp.StatusCode)
	}
}

func TestDelays(t *testing.T) {
	s, ts := newTestServer(t, Config{})
	s.Script(Response{Content: []ContentBlock{Text("ab")}, FirstByteDelay: 150 * time.Millisecond, EventDelay: 20 * time.Millisecond})
	start := time.Now()
	resp, body := do(t, http.MethodPost, ts.URL+"/v1/messages", simpleBody("hi", true), nil)
	elapsed := time.Since(start)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got status %d", resp.StatusCode)
	}
	evs, err := parseSSE(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	// 150 ms first byte + (events-1) × 20 ms.
	if want := 150*time.Millisecond + time.Duration(len(evs)-1)*20*time.Millisecond; elapsed < want {
		t.Errorf("took %v, want at least %v", elapsed, want)
	}
}

func TestDelayEndsWhenClientLeaves(t *testing.T) {
	s, ts := newTestServer(t, Config{})
	s.Script(Response{FirstByteDelay: time.Hour})
	client := &http.Client{Timeout: 100 * time.Millisecond}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, ts.URL+"/v1/messages", strings.NewReader(simpleBody("hi", true)))
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("got status %d, want a client timeout", resp.StatusCode)
	}
	// ts.Close in Cleanup blocks until the handler returns: a handler still
	// sleeping for an hour would hang the test.
}

func TestSplitChunks(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want []string
	}{
		{"", 4, []string{""}},
		{"a", 4, []string{"a"}},
		{"ab", 3, []string{"a", "b"}},
		{"{}", 3, []string{"{", "}"}},
		{"abcdefgh", 4, []string{"ab", "cd", "ef", "gh"}},
		{"abcde", 4, []string{"ab", "cd", "e"}},
		{"日本語です", 2, []string{"日本語", "です"}},
	} {
		got := splitChunks(tc.in, tc.n)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("splitChunks(%q, %d) (-want +got):\n%s", tc.in, tc.n, diff)
		}
	}
}
