package devupstream

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestHello(t *testing.T) {
	_, ts := newTestServer(t, Config{APIKey: "secret"})
	for _, method := range []string{http.MethodHead, http.MethodGet} {
		// The CLI's pre-flight carries no credential.
		resp, _ := do(t, method, ts.URL+"/api/hello", "", http.Header{"User-Agent": {"Bun/1.4.6"}})
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s /api/hello: got status %d, want 200", method, resp.StatusCode)
		}
		if !strings.HasPrefix(resp.Header.Get("request-id"), "req_dev_") {
			t.Errorf("%s /api/hello: request-id %q, want req_dev_…", method, resp.Header.Get("request-id"))
		}
	}
}

func TestCountTokens(t *testing.T) {
	_, ts := newTestServer(t, Config{})
	// count_tokens needs no max_tokens.
	body := `{"model":"claude-opus-5-5","messages":[{"role":"user","content":"` + strings.Repeat("x", 400) + `"}]}`
	resp, b := do(t, http.MethodPost, ts.URL+"/v1/messages/count_tokens?beta=true", body, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got status %d, want 200: %s", resp.StatusCode, b)
	}
	var got struct {
		InputTokens int `json:"input_tokens"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	var top struct{ Messages json.RawMessage }
	_ = json.Unmarshal([]byte(body), &top)
	if want := len(top.Messages) / 4; got.InputTokens != want {
		t.Errorf("input_tokens: got %d, want %d", got.InputTokens, want)
	}
}

// TestErrorEnvelopes checks status, error type and envelope of every
// error the server itself produces, and the request-id header on each.
func TestErrorEnvelopes(t *testing.T) {
	_, ts := newTestServer(t, Config{APIKey: "secret"})
	auth := http.Header{"X-Api-Key": {"secret"}}
	big := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("a", MaxBodyBytes) + `"}]}`
	for _, tc := range []struct {
		name, method, path, body string
		hdr                      http.Header
		status                   int
		typ                      string
	}{
		{"unknown path", http.MethodGet, "/v1/files", "", auth, 404, "not_found_error"},
		{"models without the key", http.MethodGet, "/v1/models", "", nil, 401, "authentication_error"},
		{"models, wrong method", http.MethodPost, "/v1/models", "", auth, 405, "invalid_request_error"},
		{"root", http.MethodGet, "/", "", nil, 404, "not_found_error"},
		{"prefixed path", http.MethodPost, "/conv-123/v1/messages", simpleBody("x", true), auth, 404, "not_found_error"},
		{"admin disabled", http.MethodGet, "/_dev/requests", "", nil, 404, "not_found_error"},
		{"wrong method", http.MethodGet, "/v1/messages", "", auth, 405, "invalid_request_error"},
		{"wrong method count", http.MethodPut, "/v1/messages/count_tokens", "", auth, 405, "invalid_request_error"},
		{"wrong method hello", http.MethodPost, "/api/hello", "", nil, 405, "invalid_request_error"},
		{"malformed JSON", http.MethodPost, "/v1/messages", `{"model":`, auth, 400, "invalid_request_error"},
		{"not an object", http.MethodPost, "/v1/messages", `[1,2]`, auth, 400, "invalid_request_error"},
		{"empty body", http.MethodPost, "/v1/messages", ``, auth, 400, "invalid_request_error"},
		{"missing model", http.MethodPost, "/v1/messages", `{"max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, auth, 400, "invalid_request_error"},
		{"empty model", http.MethodPost, "/v1/messages", `{"model":"","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, auth, 400, "invalid_request_error"},
		{"missing messages", http.MethodPost, "/v1/messages", `{"model":"m","max_tokens":1}`, auth, 400, "invalid_request_error"},
		{"empty messages", http.MethodPost, "/v1/messages", `{"model":"m","max_tokens":1,"messages":[]}`, auth, 400, "invalid_request_error"},
		{"message not object", http.MethodPost, "/v1/messages", `{"model":"m","max_tokens":1,"messages":["hi"]}`, auth, 400, "invalid_request_error"},
		{"missing max_tokens", http.MethodPost, "/v1/messages", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, auth, 400, "invalid_request_error"},
		{"zero max_tokens", http.MethodPost, "/v1/messages", `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, auth, 400, "invalid_request_error"},
		{"fractional max_tokens", http.MethodPost, "/v1/messages", `{"model":"m","max_tokens":1.5,"messages":[{"role":"user","content":"x"}]}`, auth, 400, "invalid_request_error"},
		{"count_tokens missing messages", http.MethodPost, "/v1/messages/count_tokens", `{"model":"m"}`, auth, 400, "invalid_request_error"},
		{"no credential", http.MethodPost, "/v1/messages", simpleBody("x", true), nil, 401, "authentication_error"},
		{"wrong key", http.MethodPost, "/v1/messages", simpleBody("x", true), http.Header{"X-Api-Key": {"nope"}}, 401, "authentication_error"},
		{"wrong bearer", http.MethodPost, "/v1/messages", simpleBody("x", true), http.Header{"Authorization": {"Bearer nope"}}, 401, "authentication_error"},
		{"key as bearer without scheme", http.MethodPost, "/v1/messages", simpleBody("x", true), http.Header{"Authorization": {"secret"}}, 401, "authentication_error"},
		{"count_tokens no credential", http.MethodPost, "/v1/messages/count_tokens", simpleBody("x", true), nil, 401, "authentication_error"},
		{"too large", http.MethodPost, "/v1/messages", big, auth, 413, "request_too_large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, tc.method, ts.URL+tc.path, tc.body, tc.hdr)
			if resp.StatusCode != tc.status {
				t.Errorf("got status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			rid := resp.Header.Get("request-id")
			if !strings.HasPrefix(rid, "req_dev_") {
				t.Errorf("request-id header: got %q, want req_dev_…", rid)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type: got %q, want application/json", ct)
			}
			var env struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
				RequestID string `json:"request_id"`
			}
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&env); err != nil {
				t.Fatalf("not an error envelope: %v: %s", err, body)
			}
			if env.Type != "error" || env.Error.Type != tc.typ || env.Error.Message == "" || env.RequestID != rid {
				t.Errorf("got envelope %+v, want type error, error.type %q, a message and request_id %q", env, tc.typ, rid)
			}
		})
	}
}

func TestWrongMethodSetsAllow(t *testing.T) {
	_, ts := newTestServer(t, Config{})
	resp, _ := do(t, http.MethodDelete, ts.URL+"/api/hello", "", nil)
	if got, want := resp.Header.Get("Allow"), "GET, HEAD"; got != want {
		t.Errorf("Allow: got %q, want %q", got, want)
	}
}

func TestAuthAccepted(t *testing.T) {
	_, ts := newTestServer(t, Config{APIKey: "secret"})
	for name, hdr := range map[string]http.Header{
		"x-api-key":           {"X-Api-Key": {"secret"}},
		"bearer":              {"Authorization": {"Bearer secret"}},
		"both, bearer wrong":  {"X-Api-Key": {"secret"}, "Authorization": {"Bearer placeholder"}},
		"both, api key wrong": {"X-Api-Key": {"placeholder"}, "Authorization": {"Bearer secret"}},
	} {
		resp, body := do(t, http.MethodPost, ts.URL+"/v1/messages", simpleBody("x", true), hdr)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: got status %d, want 200: %s", name, resp.StatusCode, body)
		}
	}
}

func TestNoAPIKeyAcceptsAnything(t *testing.T) {
	_, ts := newTestServer(t, Config{})
	for _, hdr := range []http.Header{nil, {"Authorization": {"Bearer whatever"}}, {"X-Api-Key": {"k"}}} {
		resp, body := do(t, http.MethodPost, ts.URL+"/v1/messages", simpleBody("x", false), hdr)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("headers %v: got status %d, want 200: %s", hdr, resp.StatusCode, body)
		}
	}
}

// TestCLIRequestAccepted sends a body and headers shaped like Claude Code
// 2.1.332's main call (role:system message, system blocks with
// cache_control, defer_loading tool, adaptive thinking, context
// management, output_config, metadata.user_id string) and expects the demo
// answer to its backtick command.
func TestCLIRequestAccepted(t *testing.T) {
	s, ts := newTestServer(t, Config{APIKey: "placeholder-token"})
	body := readTestdata(t, "cli_request.json")
	resp, b := do(t, http.MethodPost, ts.URL+"/v1/messages?beta=true", body, cliHeaders("placeholder-token"))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got status %d, want 200: %s", resp.StatusCode, b)
	}
	evs, err := parseSSE(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	a := assemble(t, evs)
	if len(a.Content) != 2 {
		t.Fatalf("got %d blocks, want text + tool_use: %v", len(a.Content), a.Content)
	}
	tu := a.Content[1]
	if !strings.HasPrefix(tu["id"].(string), "toolu_dev_") {
		t.Errorf("tool_use id: got %v, want toolu_dev_…", tu["id"])
	}
	delete(tu, "id")
	want := map[string]any{"type": "tool_use", "name": "Bash", "input": map[string]any{"command": "echo hello", "description": "Run echo hello"}}
	if diff := cmp.Diff(want, tu); diff != "" {
		t.Errorf("tool_use (-want +got):\n%s", diff)
	}
	if a.StopReason != "tool_use" {
		t.Errorf("stop_reason: got %v, want tool_use", a.StopReason)
	}

	// The recorder saw the CLI's credential and body unchanged.
	recs := s.Requests()
	if len(recs) != 1 {
		t.Fatalf("got %d recorded requests, want 1", len(recs))
	}
	r := recs[0]
	if r.Method != http.MethodPost || r.Path != "/v1/messages" || r.Query != "beta=true" {
		t.Errorf("recorded %s %s ? %s, want POST /v1/messages ? beta=true", r.Method, r.Path, r.Query)
	}
	if got := r.Header.Get("Authorization"); got != "Bearer placeholder-token" {
		t.Errorf("recorded Authorization: got %q, want the CLI's bearer", got)
	}
	if got := r.Header.Get("X-Claude-Code-Session-Id"); got != "fd6014dd-47de-421a-bff7-11b79c7b1b5e" {
		t.Errorf("recorded session id header: got %q", got)
	}
	if !bytes.Equal(r.Body, []byte(body)) {
		t.Errorf("recorded body differs from the one sent")
	}
}

// TestCLIRequestParsed checks what the decoder makes of the CLI's body.
func TestCLIRequestParsed(t *testing.T) {
	req, err := parseRequest([]byte(readTestdata(t, "cli_request.json")), true)
	if err != nil {
		t.Fatal(err)
	}
	if req.Model != "claude-opus-5-5" || req.MaxTokens != 128000 || !req.Stream {
		t.Errorf("got model %q max_tokens %d stream %v, want claude-opus-5-5 128000 true", req.Model, req.MaxTokens, req.Stream)
	}
	var roles []string
	for _, m := range req.Messages {
		roles = append(roles, m.Role)
	}
	if diff := cmp.Diff([]string{"user", "system"}, roles); diff != "" {
		t.Errorf("roles (-want +got):\n%s", diff)
	}
	if len(req.System) != 3 || !strings.HasPrefix(req.System[0], "x-anthropic-billing-header") {
		t.Errorf("system: got %q", req.System)
	}
	wantTools := []Tool{{Name: "Bash"}, {Name: "Read"}, {Name: "ToolSearch"}, {Name: "DeferredToolPlaceholder", DeferLoading: true}}
	if diff := cmp.Diff(wantTools, req.Tools); diff != "" {
		t.Errorf("tools (-want +got):\n%s", diff)
	}
	if req.OutputFormat != "" {
		t.Errorf("output format: got %q, want none", req.OutputFormat)
	}
}

// TestLenientDecoding sends shapes a strict decoder would reject; none
// may cause a 400.
func TestLenientDecoding(t *testing.T) {
	_, ts := newTestServer(t, Config{})
	for name, body := range map[string]string{
		"unknown top-level keys":    `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"future_thing":{"a":[1]},"top_k":3,"temperature":0.2,"stop_sequences":["x"],"service_tier":"auto","container":null,"mcp_servers":[]}`,
		"system as string":          `{"model":"m","max_tokens":5,"system":"be brief","messages":[{"role":"user","content":"hi"}]}`,
		"system odd shape":          `{"model":"m","max_tokens":5,"system":{"what":1},"messages":[{"role":"user","content":"hi"}]}`,
		"unknown block types":       `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","data":"x"}},{"type":"brand_new"},"bare string",42,{"type":"text","text":"hi","citations":[]}]}]}`,
		"image block":               `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},{"type":"text","text":"what is this?"}]}]}`,
		"thinking and redacted":     `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"s"},{"type":"redacted_thinking","data":"xx"},{"type":"text","text":"b"}]},{"role":"user","content":"c"}]}`,
		"tool_result array content": `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"out"},{"type":"image","source":{}}]}]}]}`,
		"wrong-typed fields":        `{"model":"m","max_tokens":5,"stream":"yes","tools":{"x":1},"output_config":[1],"thinking":"on","metadata":"x","messages":[{"role":7,"content":[{"type":"text","text":9}]}]}`,
		"tools entries odd":         `{"model":"m","max_tokens":5,"tools":[1,"x",{"type":"web_search_20250305","name":"web_search","max_uses":3},{"name":"Bash","defer_loading":"no"}],"messages":[{"role":"user","content":"hi"}]}`,
		"cache_control everywhere":  `{"model":"m","max_tokens":5,"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral","ttl":"1h"}}],"tools":[{"name":"Bash","input_schema":{},"cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}`,
		"content null":              `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":null}]}`,
		"only system messages":      `{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"env"}]}`,
	} {
		for _, stream := range []bool{true, false} {
			b := body
			if stream {
				b = strings.Replace(body, `"max_tokens":5`, `"max_tokens":5,"stream":true`, 1)
			}
			resp, out := do(t, http.MethodPost, ts.URL+"/v1/messages", b, nil)
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s (stream %v): got status %d, want 200: %s", name, stream, resp.StatusCode, out)
			}
		}
	}
}

func TestMissingVersionHeaderAccepted(t *testing.T) {
	_, ts := newTestServer(t, Config{})
	resp, body := do(t, http.MethodPost, ts.URL+"/v1/messages", simpleBody("x", false), http.Header{"Anthropic-Beta": {"made-up-2099-01-01"}})
	if resp.StatusCode != http.StatusOK {
		t.Errorf("got status %d, want 200: %s", resp.StatusCode, body)
	}
}

func TestRequestIDsUnique(t *testing.T) {
	_, ts := newTestServer(t, Config{})
	seen := map[string]bool{}
	for range 5 {
		resp, _ := do(t, http.MethodHead, ts.URL+"/api/hello", "", nil)
		id := resp.Header.Get("request-id")
		if seen[id] {
			t.Errorf("request-id %q repeated", id)
		}
		seen[id] = true
	}
}

func TestScriptedErrorWithRetryAfter(t *testing.T) {
	s, ts := newTestServer(t, Config{})
	s.Script(
		Response{Error: &APIError{Status: 429, Type: "rate_limit_error", Message: "Number of requests has exceeded your rate limit", Header: map[string]string{"retry-after": "2"}}},
		Response{Error: &APIError{Type: "overloaded_error"}},
		Response{Error: &APIError{Status: 429, Details: json.RawMessage(`{"error_code":"enforced_spend_limit_reached"}`), Header: map[string]string{"x-should-retry": "false"}}},
	)
	body := simpleBody("x", true)

	resp, b := do(t, http.MethodPost, ts.URL+"/v1/messages", body, nil)
	if resp.StatusCode != 429 || resp.Header.Get("retry-after") != "2" {
		t.Errorf("got status %d retry-after %q, want 429 and 2", resp.StatusCode, resp.Header.Get("retry-after"))
	}
	env := decodeJSON(t, string(b))
	wantErr := map[string]any{"type": "rate_limit_error", "message": "Number of requests has exceeded your rate limit"}
	if diff := cmp.Diff(wantErr, env["error"]); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}
	if env["request_id"] != resp.Header.Get("request-id") {
		t.Errorf("request_id %v, header %q", env["request_id"], resp.Header.Get("request-id"))
	}

	resp, b = do(t, http.MethodPost, ts.URL+"/v1/messages", body, nil)
	if resp.StatusCode != 529 {
		t.Errorf("got status %d, want 529 from the type", resp.StatusCode)
	}
	if diff := cmp.Diff(map[string]any{"type": "overloaded_error", "message": "Overloaded"}, decodeJSON(t, string(b))["error"]); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}

	resp, b = do(t, http.MethodPost, ts.URL+"/v1/messages", body, nil)
	if resp.StatusCode != 429 || resp.Header.Get("x-should-retry") != "false" {
		t.Errorf("got status %d x-should-retry %q, want 429 false", resp.StatusCode, resp.Header.Get("x-should-retry"))
	}
	wantErr = map[string]any{"type": "rate_limit_error", "message": "Too Many Requests", "details": map[string]any{"error_code": "enforced_spend_limit_reached"}}
	if diff := cmp.Diff(wantErr, decodeJSON(t, string(b))["error"]); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}

	// Queue drained: the demo answers again.
	resp, _ = do(t, http.MethodPost, ts.URL+"/v1/messages", body, nil)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("after the script: got status %d, want 200", resp.StatusCode)
	}
}

func TestScriptFIFOAndRejectedCallsDoNotConsume(t *testing.T) {
	s, ts := newTestServer(t, Config{APIKey: "k"})
	s.Script(Response{Content: []ContentBlock{Text("one")}}, Response{Content: []ContentBlock{Text("two")}})
	ok := http.Header{"X-Api-Key": {"k"}}

	// A 401 and a 400 do not use up a scripted response.
	do(t, http.MethodPost, ts.URL+"/v1/messages", simpleBody("x", false), nil)
	do(t, http.MethodPost, ts.URL+"/v1/messages", `{}`, ok)

	var got []string
	for range 2 {
		_, b := do(t, http.MethodPost, ts.URL+"/v1/messages", simpleBody("x", false), ok)
		got = append(got, decodeJSON(t, string(b))["content"].([]any)[0].(map[string]any)["text"].(string))
	}
	if diff := cmp.Diff([]string{"one", "two"}, got); diff != "" {
		t.Errorf("scripted answers (-want +got):\n%s", diff)
	}
	if n := len(s.Requests()); n != 4 {
		t.Errorf("recorded %d requests, want 4 (rejected ones too)", n)
	}
	s.Reset()
	if n := len(s.Requests()); n != 0 {
		t.Errorf("after Reset: %d recorded requests, want 0", n)
	}
}

func TestScriptedBadContentIs500(t *testing.T) {
	s, ts := newTestServer(t, Config{})
	s.Script(Response{Content: []ContentBlock{{Type: "tool_use", Name: "Bash", Input: json.RawMessage(`{"broken`)}}})
	resp, b := do(t, http.MethodPost, ts.URL+"/v1/messages", simpleBody("x", true), nil)
	if resp.StatusCode != 500 {
		t.Errorf("got status %d, want 500: %s", resp.StatusCode, b)
	}
	if typ := decodeJSON(t, string(b))["error"].(map[string]any)["type"]; typ != "api_error" {
		t.Errorf("error type: got %v, want api_error", typ)
	}
}

func TestResponderFunc(t *testing.T) {
	var seen *Request
	_, ts := newTestServer(t, Config{Responder: ResponderFunc(func(req *Request) Response {
		seen = req
		return Response{Content: []ContentBlock{Text("custom")}, StopReason: "max_tokens"}
	})})
	_, b := do(t, http.MethodPost, ts.URL+"/v1/messages?beta=true", simpleBody("hi", false), http.Header{"Anthropic-Version": {"2023-06-01"}})
	m := decodeJSON(t, string(b))
	if m["stop_reason"] != "max_tokens" {
		t.Errorf("stop_reason: got %v, want max_tokens", m["stop_reason"])
	}
	if seen == nil {
		t.Fatal("responder not called")
	}
	if seen.Path != "/v1/messages" || seen.Query.Get("beta") != "true" || seen.Header.Get("Anthropic-Version") != "2023-06-01" || seen.Stream || len(seen.Body) == 0 {
		t.Errorf("request seen: path %q query %v version %q stream %v body %d bytes", seen.Path, seen.Query, seen.Header.Get("Anthropic-Version"), seen.Stream, len(seen.Body))
	}
}

func TestRecorderBounded(t *testing.T) {
	s, ts := newTestServer(t, Config{MaxRecorded: 2})
	for _, p := range []string{"/a", "/b", "/c"} {
		do(t, http.MethodGet, ts.URL+p, "", nil)
	}
	var paths []string
	for _, r := range s.Requests() {
		paths = append(paths, r.Path)
	}
	if diff := cmp.Diff([]string{"/b", "/c"}, paths); diff != "" {
		t.Errorf("recorded paths (-want +got):\n%s", diff)
	}

	s2, ts2 := newTestServer(t, Config{MaxRecorded: -1})
	do(t, http.MethodGet, ts2.URL+"/a", "", nil)
	if n := len(s2.Requests()); n != 0 {
		t.Errorf("MaxRecorded -1: recorded %d, want 0", n)
	}
}

// TestTooLargeChunkedBody guards the limit when no Content-Length is sent.
func TestTooLargeChunkedBody(t *testing.T) {
	s, ts := newTestServer(t, Config{})
	body := io.MultiReader(
		strings.NewReader(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"`),
		strings.NewReader(strings.Repeat("a", MaxBodyBytes)),
		strings.NewReader(`"}]}`),
	)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, ts.URL+"/v1/messages", body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("got status %d, want 413", resp.StatusCode)
	}
	if recs := s.Requests(); len(recs) != 1 || recs[0].Body != nil {
		t.Errorf("got %d recorded requests, want 1 with no body", len(recs))
	}
}

func TestAPIErrorDefaults(t *testing.T) {
	for _, tc := range []struct {
		in   APIError
		want string
	}{
		{APIError{Status: 429}, "429 rate_limit_error: Too Many Requests"},
		{APIError{Type: "overloaded_error"}, "529 overloaded_error: Overloaded"},
		{APIError{Message: "x"}, "500 api_error: x"},
		{APIError{Status: 418}, "418 invalid_request_error: I'm a teapot"},
		{APIError{Status: 503}, "503 api_error: Service Unavailable"},
	} {
		if got := tc.in.Error(); got != tc.want {
			t.Errorf("%+v: got %q, want %q", tc.in, got, tc.want)
		}
	}
}
