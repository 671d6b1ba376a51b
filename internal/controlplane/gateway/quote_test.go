package gateway

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/controlplane/budget"
)

// quoteSeeds are bodies worth starting from: well-formed calls, the edges
// of max_tokens, members given twice, escaped or in another case (which
// parsers read differently), and things that are not calls at all.
var quoteSeeds = []string{
	`{"model":"claude-sonnet-4-5-20250929","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
	`{"model":"claude-sonnet-4-5-20250929","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`,
	`{"model":"claude-opus-4-1","max_tokens":64000,"messages":[{"role":"user","content":"x"}]}`,
	`{"model":"x","max_tokens":-5,"messages":[{"role":"user","content":"x"}]}`,
	`{"model":null,"max_tokens":null}`,
	`null`, `{}`, `[]`, `"s"`, ``, `{"max_tokens":1e3}`,
	`{"model":"claude-3-haiku-20240307","max_tokens":1,"stream":true,"max\u005ftokens":64000,"mod\u0065l":"claude-opus-4-1-20250805","messages":[{"role":"user","content":"x"}]}`,
	`{"model":"claude-3-haiku-20240307","max_tokens":1,"Max_Tokens":64000,"messages":[{"role":"user","content":"x"}]}`,
	`{"model":"claude-sonnet-4-5","max_tokens":4096,"thinking":{"type":"enabled","budget_tokens":2048},"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":5}],"messages":[]}`,
}

// FuzzQuoteBody fuzzes how the gateway reads and prices a messages body,
// directly (thousands of bodies a second; TestGatewayMessagesBodies sends
// the seeds through a whole gateway). Whatever the body: a refusal is a
// 4xx; a quote reserves a positive worst case at least its floor; what
// encoding/json reads of the body (names matched case-insensitively, the
// last duplicate winning; what an upstream written in Go would read) is
// never worth more than the reservation; and a body lowered to fit a
// budget reads, to encoding/json too, as the lowered max_tokens and the
// same model.
func FuzzQuoteBody(f *testing.F) {
	for _, s := range quoteSeeds {
		f.Add([]byte(s))
	}
	prices := budget.DefaultPrices()
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, body []byte) {
		q, ref := quoteBody(prices, body, at)
		if ref != nil {
			if ref.err.Status < 400 || ref.err.Status >= 500 {
				t.Fatalf("body %q: refused with %d, want a 4xx", body, ref.err.Status)
			}
			return
		}
		if q.amount <= 0 || q.floor <= 0 || q.floor > q.amount {
			t.Fatalf("body %q: reserves %d with floor %d, want 0 < floor <= amount", body, q.amount, q.floor)
		}
		var read struct {
			Model     string
			MaxTokens int64 `json:"max_tokens"`
		}
		if json.Unmarshal(body, &read) == nil {
			price, _ := prices.PriceFor(read.Model, at)
			if want := price.WorstCase(int64(len(body))/3, read.MaxTokens); q.amount < want {
				t.Fatalf("body %q: reserved %d nano-USD, but encoding/json reads model %q max_tokens %d, worth up to %d",
					body, q.amount, read.Model, read.MaxTokens, want)
			}
		}
		n := int64(MinLoweredMaxTokens)
		if q.head.MaxTokens <= n {
			return
		}
		lowered, ok := q.head.WithMaxTokens(body, n)
		if !ok {
			t.Fatalf("body %q: max_tokens %d could not be lowered", body, q.head.MaxTokens)
		}
		lq, lref := quoteBody(prices, lowered, at)
		if lref != nil || lq.head.MaxTokens != n || lq.head.Model != q.head.Model {
			t.Fatalf("body %q lowered to %q: quoted %+v %v, want max_tokens %d of model %q", body, lowered, lq.head, lref, n, q.head.Model)
		}
		read.MaxTokens, read.Model = 0, ""
		if json.Unmarshal(lowered, &read) == nil && (read.MaxTokens != n || read.Model != q.head.Model) {
			t.Fatalf("body %q lowered to %q: encoding/json reads model %q max_tokens %d", body, lowered, read.Model, read.MaxTokens)
		}
	})
}
