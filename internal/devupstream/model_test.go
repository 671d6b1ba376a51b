package devupstream

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestDemoAnswersNameItsOwnModel guards against the demo being priced as
// the model the CLI asks for (case F3: an Opus-class price for every demo
// turn): demo answers name ModelID whatever the request says, scripted
// answers keep the request's model.
func TestDemoAnswersNameItsOwnModel(t *testing.T) {
	s := New(Config{})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	post := func(stream bool) string {
		t.Helper()
		body := `{"model":"claude-opus-4-1","max_tokens":64,"stream":` + map[bool]string{true: "true", false: "false"}[stream] +
			`,"messages":[{"role":"user","content":"hello"}]}`
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/v1/messages", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("anthropic-version", "2023-06-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("got %d %s, want 200", resp.StatusCode, b)
		}
		if stream {
			for _, line := range strings.Split(string(b), "\n") {
				if data, ok := strings.CutPrefix(line, "data: "); ok && strings.Contains(data, `"message_start"`) {
					var ev struct{ Message struct{ Model string } }
					json.Unmarshal([]byte(data), &ev)
					return ev.Message.Model
				}
			}
			t.Fatalf("no message_start in %s", b)
		}
		var m struct{ Model string }
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m.Model
	}
	for _, stream := range []bool{false, true} {
		if got := post(stream); got != ModelID {
			t.Errorf("demo answer (stream %v) names model %q, want %q", stream, got, ModelID)
		}
	}
	s.Script(Response{Content: []ContentBlock{Text("scripted")}})
	if got := post(false); got != "claude-opus-4-1" {
		t.Errorf("scripted answer names model %q, want the request's", got)
	}
}
