package devupstream

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// newTestServer starts s behind a real HTTP server.
func newTestServer(t *testing.T, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	s := New(cfg)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts
}

// cliHeaders are the headers Claude Code 2.1.332 sends on POST
// /v1/messages (protocol notes §1.2), with the bearer token given.
func cliHeaders(token string) http.Header {
	h := http.Header{}
	for k, v := range map[string]string{
		"Accept":                                    "application/json",
		"Authorization":                             "Bearer " + token,
		"Content-Type":                              "application/json",
		"User-Agent":                                "claude-cli/2.1.332 (external, sdk-cli)",
		"X-Claude-Code-Session-Id":                  "fd6014dd-47de-421a-bff7-11b79c7b1b5e",
		"X-Stainless-Arch":                          "x64",
		"X-Stainless-Lang":                          "js",
		"X-Stainless-OS":                            "Linux",
		"X-Stainless-Package-Version":               "0.128.0",
		"X-Stainless-Retry-Count":                   "0",
		"X-Stainless-Runtime":                       "node",
		"X-Stainless-Runtime-Version":               "v26.12.1",
		"X-Stainless-Timeout":                       "600",
		"anthropic-beta":                            "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,per-turn-control-2026-07-01,mid-conversation-tool-changes-2026-07-01,thinking-token-count-2026-05-13,advanced-tool-use-2025-11-20,effort-2025-11-24,thinking-display-updates-2026-08-18",
		"anthropic-dangerous-direct-browser-access": "true",
		"anthropic-version":                         "2023-06-01",
		"x-app":                                     "cli",
	} {
		h.Set(k, v)
	}
	return h
}

// do sends a request and returns the response with its body read.
func do(t *testing.T, method, url, body string, hdr http.Header) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp, b
}

// readTestdata returns testdata/name.
func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// simpleBody is a minimal valid Messages request with one user text.
func simpleBody(text string, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model":      "claude-opus-5-5",
		"max_tokens": 1024,
		"stream":     stream,
		"messages":   []any{map[string]any{"role": "user", "content": text}},
		"tools":      []any{map[string]any{"name": "Bash", "input_schema": map[string]any{"type": "object"}}},
	})
	return string(b)
}

// sseEvent is one parsed server-sent event.
type sseEvent struct {
	Name string
	Data string
}

// parseSSE reads events until EOF. It returns the events read and the
// read error, nil at a clean end of stream; an unterminated last event is
// an error, as is any line that is neither event:, data: nor blank.
func parseSSE(r io.Reader) ([]sseEvent, error) {
	br := bufio.NewReader(r)
	var evs []sseEvent
	var cur sseEvent
	pending := false
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && line == "" && !pending {
				return evs, nil
			}
			if errors.Is(err, io.EOF) {
				return evs, io.ErrUnexpectedEOF
			}
			return evs, err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if pending {
				evs = append(evs, cur)
			}
			cur, pending = sseEvent{}, false
		case strings.HasPrefix(line, "event: "):
			cur.Name, pending = strings.TrimPrefix(line, "event: "), true
		case strings.HasPrefix(line, "data: "):
			if cur.Data != "" {
				return evs, errors.New("two data lines in one event")
			}
			cur.Data, pending = strings.TrimPrefix(line, "data: "), true
		default:
			return evs, errors.New("unexpected SSE line " + line)
		}
	}
}

// names lists the event names.
func names(evs []sseEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Name
	}
	return out
}

// decodeJSON unmarshals s into a generic value, failing the test if it
// is not JSON.
func decodeJSON(t *testing.T, s string) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("not a JSON object: %v: %s", err, s)
	}
	return v
}

// assembled is a message rebuilt from SSE events, as an SDK accumulates it.
type assembled struct {
	Start      map[string]any   // message of message_start
	Content    []map[string]any // blocks: start block + concatenated deltas
	StopReason any
	DeltaUsage map[string]any
}

// assemble checks the event grammar of a complete stream (message_start,
// ping, per block start/deltas/stop with increasing index, message_delta,
// message_stop; data "type" equal to the event name) and rebuilds the
// message.
func assemble(t *testing.T, evs []sseEvent) assembled {
	t.Helper()
	var a assembled
	open := -1
	partial := map[int]string{}
	for i, e := range evs {
		d := decodeJSON(t, e.Data)
		if d["type"] != e.Name {
			t.Errorf("event %d: got data type %v, want %q", i, d["type"], e.Name)
		}
		switch e.Name {
		case "message_start":
			if i != 0 {
				t.Errorf("message_start at %d, want 0", i)
			}
			a.Start, _ = d["message"].(map[string]any)
		case "ping":
		case "content_block_start":
			idx := int(d["index"].(float64))
			if open != -1 || idx != len(a.Content) {
				t.Fatalf("content_block_start index %d with %d blocks, open %d", idx, len(a.Content), open)
			}
			open = idx
			a.Content = append(a.Content, d["content_block"].(map[string]any))
		case "content_block_delta":
			idx := int(d["index"].(float64))
			if idx != open {
				t.Fatalf("delta for index %d while %d is open", idx, open)
			}
			delta := d["delta"].(map[string]any)
			blk := a.Content[idx]
			switch delta["type"] {
			case "text_delta":
				blk["text"] = blk["text"].(string) + delta["text"].(string)
			case "input_json_delta":
				partial[idx] += delta["partial_json"].(string)
			case "thinking_delta":
				blk["thinking"] = blk["thinking"].(string) + delta["thinking"].(string)
			case "signature_delta":
				blk["signature"] = delta["signature"]
			default:
				t.Errorf("unknown delta type %v", delta["type"])
			}
		case "content_block_stop":
			idx := int(d["index"].(float64))
			if idx != open {
				t.Fatalf("stop for index %d while %d is open", idx, open)
			}
			if js, ok := partial[idx]; ok {
				var input any
				if err := json.Unmarshal([]byte(js), &input); err != nil {
					t.Errorf("block %d: partial_json chunks %q do not make JSON: %v", idx, js, err)
				}
				a.Content[idx]["input"] = input
			}
			open = -1
		case "message_delta":
			delta := d["delta"].(map[string]any)
			a.StopReason = delta["stop_reason"]
			if v, ok := delta["stop_sequence"]; !ok || v != nil {
				t.Errorf("message_delta stop_sequence: got %v (present %v), want null", v, ok)
			}
			a.DeltaUsage, _ = d["usage"].(map[string]any)
		case "message_stop":
			if i != len(evs)-1 {
				t.Errorf("message_stop at %d of %d", i, len(evs))
			}
		default:
			t.Errorf("unexpected event %q", e.Name)
		}
	}
	if open != -1 {
		t.Errorf("block %d never stopped", open)
	}
	return a
}
