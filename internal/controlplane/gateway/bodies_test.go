package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/gateway"
)

// TestGatewayMessagesBodies posts bodies to /v1/messages with a valid
// WorkerToken, through a whole gateway: the seeds of FuzzQuoteBody (which
// fuzzes the reading and pricing itself, thousands of bodies a second) and
// the helpers' well-formed calls. Whatever the body, the gateway must not
// fail with a 5xx of its own, must never reserve a non-positive amount, and
// must leave nothing reserved once the call is over. And what reached the
// upstream, read by encoding/json (names matched case-insensitively, the
// last duplicate winning), was reserved at least at that reading's worst
// case: the gateway never prices a call by a reading the upstream may not
// share.
func TestGatewayMessagesBodies(t *testing.T) {
	fx := newFixture(t)
	tok := fx.workerToken(t, convID, userID)
	prices := budget.DefaultPrices()
	bodies := append([]string{messagesBody(true, 1024), messagesBody(false, 1)}, gateway.QuoteSeeds...)
	for i, seed := range bodies {
		t.Run(fmt.Sprint(i), func(t *testing.T) { checkMessagesBody(t, fx, tok, prices, []byte(seed)) })
	}
}

func checkMessagesBody(t *testing.T, fx *fixture, tok string, prices *budget.PriceTable, body []byte) {
	before := len(fx.ledger(t, userID))
	forwarded := len(fx.up.Requests())
	req := fx.request(t.Context(), t, http.MethodPost, "/v1/messages", tok, bytes.NewReader(body))
	got := do(t, req)
	if got.status >= 500 {
		t.Fatalf("body %q: got status %d (%s), want < 500", body, got.status, got.body)
	}
	fx.waitNothingReserved(t, userID)
	var reserved budget.NanoUSD
	for _, r := range fx.ledger(t, userID)[before:] {
		if r.Kind == "reserve" && r.Amount <= 0 {
			t.Fatalf("body %q: reserved %d nano-USD, want a positive worst case", body, r.Amount)
		}
		if r.Kind == "reserve" {
			reserved = r.Amount
		}
	}
	reqs := fx.up.Requests()
	if len(reqs) == forwarded || reqs[len(reqs)-1].Body == nil {
		return // not forwarded (or not recorded)
	}
	up := reqs[len(reqs)-1].Body
	var read struct {
		Model     string
		MaxTokens int64 `json:"max_tokens"`
	}
	if json.Unmarshal(up, &read) != nil {
		return
	}
	price, _ := prices.PriceFor(read.Model, time.Now())
	if want := price.WorstCase(int64(len(up))/3, read.MaxTokens); reserved < want {
		t.Fatalf("body %q: reserved %d nano-USD, but the upstream read model %q max_tokens %d, worth up to %d",
			body, reserved, read.Model, read.MaxTokens, want)
	}
}
