package devupstream

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParseRequest feeds arbitrary bodies to the request decoder, and
// whatever it accepts to the demo responder and the event encoder: none of
// them may panic, and an accepted request must have what every answer
// needs.
func FuzzParseRequest(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.json"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		``, `null`, `{}`, `[]`, `"x"`,
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"run ` + "`ls`" + `"}],"tools":[{"name":"Bash"}]}`,
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"x"}]}]}]}`,
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"output_config":{"format":{"type":"json_schema","schema":{"type":"object","properties":{"a":{"type":"object","properties":{"b":{}}}}}}}}`,
		`{"model":"m","max_tokens":1e400,"messages":[{}]}`,
	} {
		f.Add([]byte(s))
	}
	s := New(Config{})
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := parseRequest(body, true)
		if err != nil {
			if req != nil {
				t.Fatalf("got a request and an error %v", err)
			}
			if _, ok := err.(*APIError); !ok {
				t.Fatalf("error %T, want *APIError", err)
			}
			return
		}
		if req.Model == "" || len(req.Messages) == 0 || req.MaxTokens < 1 || req.InputTokens < 1 {
			t.Fatalf("accepted an incomplete request: model %q, %d messages, max_tokens %d, input tokens %d",
				req.Model, len(req.Messages), req.MaxTokens, req.InputTokens)
		}
		resp := DemoResponder{}.Respond(req)
		m, err := buildMessage(req, resp, s.newID)
		if err != nil {
			t.Fatalf("demo answer does not build: %v", err)
		}
		if _, err := m.events(); err != nil {
			t.Fatalf("events: %v", err)
		}
		if _, err := m.nonStreamingJSON(); err != nil {
			t.Fatalf("non-streaming JSON: %v", err)
		}
	})
}
