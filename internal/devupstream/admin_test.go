package devupstream

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestAdminScriptRequestsReset(t *testing.T) {
	_, ts := newTestServer(t, Config{EnableAdmin: true, APIKey: "k"})
	script := `[
	  {"content": [{"type": "text", "text": "scripted"}, {"type": "tool_use", "id": "toolu_s", "name": "Bash", "input": {"command": "ls"}}],
	   "usage": {"input_tokens": 7, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 3}},
	  {"error": {"status": 429, "type": "rate_limit_error", "message": "slow down", "headers": {"retry-after": "3"}}},
	  {"stream_error": {"after_events": 1}, "event_delay_ms": 1}
	]`
	resp, b := do(t, http.MethodPost, ts.URL+"/_dev/script", script, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("script: got status %d: %s", resp.StatusCode, b)
	}
	if diff := cmp.Diff(map[string]any{"queued": 3.0}, decodeJSON(t, string(b))); diff != "" {
		t.Errorf("script answer (-want +got):\n%s", diff)
	}

	auth := http.Header{"Authorization": {"Bearer k"}}
	_, b = do(t, http.MethodPost, ts.URL+"/v1/messages", simpleBody("x", true), auth)
	evs, err := parseSSE(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	a := assemble(t, evs)
	want := []map[string]any{
		{"type": "text", "text": "scripted"},
		{"type": "tool_use", "id": "toolu_s", "name": "Bash", "input": map[string]any{"command": "ls"}},
	}
	if diff := cmp.Diff(want, a.Content); diff != "" {
		t.Errorf("content (-want +got):\n%s", diff)
	}
	if a.DeltaUsage["output_tokens"] != 3.0 || a.DeltaUsage["input_tokens"] != 7.0 {
		t.Errorf("usage: got %v, want the scripted 7/3", a.DeltaUsage)
	}

	resp, _ = do(t, http.MethodPost, ts.URL+"/v1/messages", simpleBody("x", true), auth)
	if resp.StatusCode != 429 || resp.Header.Get("retry-after") != "3" {
		t.Errorf("got status %d retry-after %q, want 429 and 3", resp.StatusCode, resp.Header.Get("retry-after"))
	}
	_, b = do(t, http.MethodPost, ts.URL+"/v1/messages", simpleBody("x", true), auth)
	evs, _ = parseSSE(bytes.NewReader(b))
	if diff := cmp.Diff([]string{"message_start", "error"}, names(evs)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}

	resp, b = do(t, http.MethodGet, ts.URL+"/_dev/requests", "", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("requests: got status %d", resp.StatusCode)
	}
	var recs []RecordedRequest
	if err := json.Unmarshal(b, &recs); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("got %d recorded requests, want 3 (admin calls excluded)", len(recs))
	}
	if got := recs[0].Header.Get("Authorization"); got != "Bearer k" {
		t.Errorf("recorded Authorization: got %q, want Bearer k", got)
	}
	if string(recs[0].Body) != simpleBody("x", true) {
		t.Errorf("recorded body: got %q", recs[0].Body)
	}
	if !strings.Contains(string(b), `"body":"{\"max_tokens\"`) {
		t.Errorf("body should be JSON text, not base64: %.200s", b)
	}

	resp, _ = do(t, http.MethodPost, ts.URL+"/_dev/reset", "", nil)
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("reset: got status %d, want 204", resp.StatusCode)
	}
	_, b = do(t, http.MethodGet, ts.URL+"/_dev/requests", "", nil)
	if strings.TrimSpace(string(b)) != "[]" {
		t.Errorf("after reset: got %s, want []", b)
	}
}

func TestAdminScriptRejectsBadInput(t *testing.T) {
	_, ts := newTestServer(t, Config{EnableAdmin: true})
	for name, body := range map[string]string{
		"not an array":        `{"content":[]}`,
		"unknown field":       `[{"contnet":[]}]`,
		"unknown block field": `[{"content":[{"type":"text","txt":"x"}]}]`,
		"bad block type":      `[{"content":[{"type":"image"}]}]`,
		"tool_use no name":    `[{"content":[{"type":"tool_use","input":{}}]}]`,
		"tool_use input type": `[{"content":[{"type":"tool_use","name":"x","input":[1]}]}]`,
		"negative delay":      `[{"event_delay_ms":-1}]`,
	} {
		resp, b := do(t, http.MethodPost, ts.URL+"/_dev/script", body, nil)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: got status %d, want 400: %s", name, resp.StatusCode, b)
		}
	}
	resp, b := do(t, http.MethodGet, ts.URL+"/_dev/script", "", nil)
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /_dev/script: got status %d, want 405: %s", resp.StatusCode, b)
	}
}

func TestResponseJSONRoundTrip(t *testing.T) {
	in := Response{
		Content:        []ContentBlock{Text("a"), ToolUse("Bash", map[string]string{"command": "ls"}), {Type: "thinking", Thinking: "t", Signature: "s"}},
		StopReason:     "tool_use",
		Usage:          &Usage{InputTokens: 1, OutputTokens: 2, CacheCreation: &CacheCreation{Ephemeral1hInputTokens: 3}},
		Error:          &APIError{Status: 500, Type: "api_error", Message: "m", Header: map[string]string{"x": "y"}},
		StreamError:    &StreamError{AfterEvents: 2, Type: "api_error", Message: "m"},
		Cut:            &Cut{AfterEvents: 5},
		FirstByteDelay: 1500 * time.Millisecond,
		EventDelay:     20 * time.Millisecond,
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out Response
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
	if diff := cmp.Diff(in, out, cmp.Comparer(jsonEqual)); diff != "" {
		t.Errorf("round trip (-in +out):\n%s", diff)
	}
}
