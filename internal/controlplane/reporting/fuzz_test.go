package reporting

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
)

// FuzzReportBodies feeds arbitrary bytes to the decoding and validation of
// every report body the endpoints accept: no panic, and an accepted body
// survives a round trip through encoding/json still valid.
func FuzzReportBodies(f *testing.F) {
	for _, s := range []string{
		`{"idempotency_key":"c1:4:tool","event_id":4,"time":"2026-01-02T03:04:05Z","phase":"use","tool_use_id":"t1","name":"Bash","input":{"command":"ls"}}`,
		`{"idempotency_key":"c1:5:tool","event_id":5,"time":"2026-01-02T03:04:05Z","phase":"result","tool_use_id":"t1","output":"x","is_error":true}`,
		`{"idempotency_key":"c1:9:usage","event_id":9,"time":"2026-01-02T03:04:05Z","client_message_id":"m1","outcome":"failed","usage":{"input_tokens":1},"cost_nano_usd":3}`,
		`{"idempotency_key":"c1:1:activity","event_id":1,"time":"2026-01-02T03:04:05Z","type":"turn_started","summary":"s"}`,
		`{"idempotency_key":"k","title":"t","body":"b"}`,
		`{"idempotency_key":"k","title":"t","state":"closed"}`,
		`{"idempotency_key":"k","body":"c"}`,
		`{"idempotency_key":"k","title":"\u2028x"}`, `{}`, `[]`, `null`, `{"input":{"a":`,
	} {
		f.Add([]byte(s))
	}
	newOf := []func() interface{ Validate() error }{
		func() interface{ Validate() error } { return &contract.ToolEventReport{} },
		func() interface{ Validate() error } { return &contract.UsageReport{} },
		func() interface{ Validate() error } { return &contract.ActivityReport{} },
		func() interface{ Validate() error } { return &contract.IssueCreate{} },
		func() interface{ Validate() error } { return &contract.IssueUpdate{} },
		func() interface{ Validate() error } { return &contract.IssueComment{} },
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, _ := http.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set("Content-Type", "application/json")
		for _, mk := range newOf {
			v := mk()
			if httpapi.DecodeJSON(r, body, v) != nil || v.Validate() != nil {
				continue
			}
			b, err := json.Marshal(v)
			if err != nil {
				t.Fatalf("%T: marshal accepted value: %v", v, err)
			}
			w := mk()
			if err := httpapi.DecodeJSON(r, b, w); err != nil {
				t.Fatalf("%T: re-decode %s: %v", v, b, err)
			}
			if err := w.Validate(); err != nil {
				t.Fatalf("%T: accepted %q, but its round trip %s is refused: %v", v, body, b, err)
			}
		}
	})
}
