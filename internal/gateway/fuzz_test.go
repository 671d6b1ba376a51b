package gateway_test

import (
	"bytes"
	"net/http"
	"testing"
)

// FuzzGatewayMessagesBody posts arbitrary bodies to /v1/messages with a
// valid WorkerToken. Whatever the body, the gateway must not fail with a
// 5xx of its own, must never reserve a non-positive amount, and must leave
// nothing reserved once the call is over.
func FuzzGatewayMessagesBody(f *testing.F) {
	for _, seed := range []string{
		messagesBody(true, 1024),
		messagesBody(false, 1),
		`{"model":"claude-opus-4-1","max_tokens":64000,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"x","max_tokens":-5,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":null,"max_tokens":null}`,
		`null`, `{}`, `[]`, `"s"`, ``, `{"max_tokens":1e3}`,
	} {
		f.Add([]byte(seed))
	}
	fx := newFixture(f)
	tok := fx.workerToken(f, convID, userID)
	f.Fuzz(func(t *testing.T, body []byte) {
		before := len(fx.ledger(t, userID))
		req := fx.request(t.Context(), t, http.MethodPost, "/v1/messages", tok, bytes.NewReader(body))
		got := do(t, req)
		if got.status >= 500 {
			t.Fatalf("body %q: got status %d (%s), want < 500", body, got.status, got.body)
		}
		fx.waitNothingReserved(t, userID)
		for _, r := range fx.ledger(t, userID)[before:] {
			if r.Kind == "reserve" && r.Amount <= 0 {
				t.Fatalf("body %q: reserved %d nano-USD, want a positive worst case", body, r.Amount)
			}
		}
	})
}
