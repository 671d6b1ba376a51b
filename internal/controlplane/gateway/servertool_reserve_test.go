package gateway_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/controlplane/budget"
)

// Issue 28 item 5, server tools: a call with web search (max_uses 5)
// reserved about 30 times what it bills (3.43 USD against 0.11 USD on
// Sonnet 4.5), so a user on the default limit (100 USD) could have only
// 29 such calls in flight.

// webSearchBody is a small Messages call that may search the web 5 times.
const webSearchBody = `{"model":"` + model + `","max_tokens":1024,` +
	`"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":5}],` +
	`"messages":[{"role":"user","content":"What changed in Go 1.26? Search the web."}]}`

// maxServerToolUpstream answers a web-search call with the most its usage
// can be under the documented bound (docs/gateway-money.md, "The worst
// case"): every search used, each adding the price table's result tokens;
// the context of the last sampling (the prompt as the gateway estimates it,
// every result and the whole max_tokens of output) written to the cache at
// the 1-hour rate, read back from the cache by each of the 5 samplings
// after the first, max_tokens of output, in the dearest geo. With plain,
// the context is billed as uncached input instead.
type maxServerToolUpstream struct{ plain bool }

func (u maxServerToolUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var req struct {
		Model     string
		MaxTokens int64 `json:"max_tokens"`
		Tools     []struct {
			MaxUses int64 `json:"max_uses"`
		}
	}
	json.Unmarshal(b, &req)
	search, _ := budget.DefaultPrices().ServerTool("web_search_20250305")
	uses := req.Tools[0].MaxUses
	context := int64(len(b))/3 + 1 + uses*search.InputTokensPerUse + req.MaxTokens
	usage := fmt.Sprintf(`{"input_tokens":0,"cache_creation_input_tokens":%d,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":%d},`+
		`"cache_read_input_tokens":%d,"output_tokens":%d,"server_tool_use":{"web_search_requests":%d},"inference_geo":"us"}`,
		context, context, uses*context, req.MaxTokens, uses)
	if u.plain {
		usage = fmt.Sprintf(`{"input_tokens":%d,"output_tokens":%d,"server_tool_use":{"web_search_requests":%d},"inference_geo":"us"}`,
			context, req.MaxTokens, uses)
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"found it"}],`+
		`"stop_reason":"end_turn","stop_sequence":null,"usage":%s}`, req.Model, usage)
}

// TestGatewayServerToolReservationFitsWhatTheToolCanCost guards against a
// web-search call (max_uses 5) reserving about 30 times what it bills: its
// reservation is what the tool can cost (the per-use fee times the uses it
// may make, plus the input its results add, each use's at the price
// table's bound, read back by the later samplings at the cache-read rate),
// a user on the default limit can have at least 100 such calls in flight,
// and the reservation still covers the bill of a call that uses every
// search and adds the most result tokens.
func TestGatewayServerToolReservationFitsWhatTheToolCanCost(t *testing.T) {
	prices := budget.DefaultPrices()
	price, _ := prices.PriceFor(model, time.Now())
	search, _ := prices.ServerTool("web_search_20250305")

	// The documented worst case, in USD, worked out here on its own.
	const uses, maxTokens, geo = 5, 1024, 1.1 // the built-in table's dearest geo: "us" 1.1
	perM := func(rate budget.NanoUSD) float64 { return float64(rate) / 1e9 / 1e6 }
	prompt := float64(len(webSearchBody)/3 + 1)
	ctx := prompt + uses*float64(search.InputTokensPerUse) + maxTokens
	inputSide := max(perM(price.Input), perM(price.CacheWrite5m), perM(price.CacheWrite1h), perM(price.CacheRead))
	fee := max(float64(price.WebSearch), float64(search.PerUse)) / 1e9
	want := geo * (ctx*inputSide + uses*ctx*perM(price.CacheRead) + maxTokens*perM(price.Output) + uses*fee)

	f := newFixtureWith(t, fixtureOptions{upstream: serverToolUpstream{}})
	if got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, "probe"), strings.NewReader(webSearchBody))); got.status != http.StatusOK {
		t.Fatalf("probe: got %d %s, want 200", got.status, got.body)
	}
	l := f.waitDebits(t, "probe", 1)
	reserved, billed := l[0].Amount, l[1].Amount
	t.Logf("web search, max_uses 5, max_tokens 1024, %s: reserved %s USD, a typical call (25 000 input tokens, 500 output, 3 searches) billed %s USD: %.1f times",
		model, budget.FormatUSD(reserved), budget.FormatUSD(billed), float64(reserved)/float64(billed))
	if got := float64(reserved) / 1e9; math.Abs(got-want) > 1e-8 {
		t.Errorf("reservation: got %s USD, want %.9f USD (fee times uses plus the input the results add, read back at the cache-read rate)", budget.FormatUSD(reserved), want)
	}
	limit := 100 * budget.NanoPerUSD // the default limit
	if n := limit / reserved; n < 100 {
		t.Errorf("a user on the default limit can have %d such calls in flight, want at least 100", n)
	}

	// Held at the upstream, 40 such calls are in flight at once for a user
	// on the default limit.
	hold := make(chan struct{})
	f.rec.hold.Store(&hold)
	const n = 40
	statuses := make(chan int, n)
	tok := f.workerToken(t, convID, userID)
	for range n {
		f.sendAsync(t, tok, webSearchBody, statuses)
	}
	got := map[int]int{}
	waitFor(t, "every call admitted or refused", func() bool {
		for {
			select {
			case s := <-statuses:
				got[s]++
				continue
			default:
			}
			return int(f.rec.arrivals.Load())-1+got[http.StatusTooManyRequests] == n
		}
	})
	close(hold)
	for got[http.StatusOK]+got[http.StatusTooManyRequests]+got[-1] < n {
		got[<-statuses]++
	}
	if got[http.StatusOK] != n {
		t.Errorf("%d calls at once on the default limit: got statuses %v, want all admitted", n, got)
	}
	f.waitDebits(t, userID, got[http.StatusOK])

	// The reservation is an upper bound: a call that uses every search and
	// adds the most result tokens costs no more.
	for _, plain := range []bool{false, true} {
		t.Run(fmt.Sprintf("max usage, plain input %v", plain), func(t *testing.T) {
			f := newFixtureWith(t, fixtureOptions{upstream: maxServerToolUpstream{plain: plain}})
			if got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(webSearchBody))); got.status != http.StatusOK {
				t.Fatalf("got %d %s, want 200", got.status, got.body)
			}
			l := f.waitDebits(t, userID, 1)
			if d := l[1]; d.Outcome != "complete" || d.Amount > l[0].Amount {
				t.Errorf("a call using all 5 searches with the most result tokens: billed %s USD (%s), reserved %s USD: the bill must not exceed the reservation",
					budget.FormatUSD(d.Amount), d.Outcome, budget.FormatUSD(l[0].Amount))
			}
			t.Logf("most a call can bill: %s USD against its reservation of %s USD", budget.FormatUSD(l[1].Amount), budget.FormatUSD(l[0].Amount))
		})
	}
}
