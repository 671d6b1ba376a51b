package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/gateway"
	"github.com/talkide/talkide/internal/devupstream"
)

// Money faults found from outside (what a call is booked at when its usage
// is cut, unreadable or never comes, and a first run's budget), and
// budgets smaller than one worst case.

// TestGatewayBooksNonStreamingCallWhoseClientLeft guards against case M1: a
// client that left a non-streaming call before the answer was booked
// nothing, and the upstream call was cancelled, so an agent could keep
// large calls off the ledger by aborting them.
func TestGatewayBooksNonStreamingCallWhoseClientLeft(t *testing.T) {
	f := newFixture(t)
	usage := &devupstream.Usage{InputTokens: 3000, OutputTokens: 800}
	f.up.Script(devupstream.Response{Content: []devupstream.ContentBlock{devupstream.Text("a slow answer")}, Usage: usage})
	hold := make(chan struct{})
	f.rec.hold.Store(&hold)
	ctx, cancel := context.WithCancel(t.Context())
	req := f.request(ctx, t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(messagesBody(false, 1024)))
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	waitFor(t, "the call reaching the upstream", func() bool { return f.rec.arrivals.Load() == 1 })
	cancel() // the client times out while the upstream works
	if err := <-errc; err == nil {
		t.Fatal("the client got an answer, want its own cancellation")
	}
	time.Sleep(50 * time.Millisecond) // let the gateway see the client go (it must not matter)
	close(hold)
	ledger := f.waitDebits(t, userID, 1)
	checkDebit(t, f, ledger, anthropic.Usage{Model: model, InputTokens: 3000, OutputTokens: 800}, "client_disconnect")
}

// gatedStream is an upstream that sends the 200 headers of a stream at
// once, message_start only when gate closes, and then nothing until its
// request is cancelled (cancelled closes).
type gatedStream struct {
	gate      chan struct{}
	cancelled chan struct{}
}

func (g *gatedStream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	select {
	case <-g.gate:
	case <-r.Context().Done():
		return
	}
	fmt.Fprintf(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\","+
		"\"model\":%q,\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":3000,\"output_tokens\":1}}}\n\n", model)
	w.(http.Flusher).Flush()
	select {
	case <-r.Context().Done():
		close(g.cancelled)
	case <-time.After(time.Minute):
	}
}

// TestGatewayBooksStreamWhoseClientLeftBeforeMessageStart guards against
// case M1 for streams: a client that left after the 200 headers but before
// message_start was booked 0. The gateway reads on until message_start,
// books its input, and then cancels the upstream call.
func TestGatewayBooksStreamWhoseClientLeftBeforeMessageStart(t *testing.T) {
	up := &gatedStream{gate: make(chan struct{}), cancelled: make(chan struct{})}
	f := newFixtureWith(t, fixtureOptions{upstream: up})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req := f.request(ctx, t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(messagesBody(true, 1024)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	cancel() // gone after the headers, before message_start
	resp.Body.Close()
	time.Sleep(50 * time.Millisecond) // let the gateway see the client go (it must not matter)
	close(up.gate)
	ledger := f.waitDebits(t, userID, 1)
	checkDebit(t, f, ledger, anthropic.Usage{Model: model, InputTokens: 3000, OutputTokens: 1}, "client_disconnect")
	waitFor(t, "the upstream call cancelled after message_start", func() bool {
		select {
		case <-up.cancelled:
			return true
		default:
			return false
		}
	})
}

// TestGatewayBooksInputWhenClientLeftAndUsageNeverCame: a call whose client
// left and whose upstream never answered within Config.ClientGoneWait is
// cancelled and booked at its input-side worst case, never at zero.
func TestGatewayBooksInputWhenClientLeftAndUsageNeverCame(t *testing.T) {
	f := newFixtureWith(t, fixtureOptions{clientGoneWait: 100 * time.Millisecond})
	hold := make(chan struct{}) // never opened: the upstream call ends when the gateway cancels it
	f.rec.hold.Store(&hold)
	t.Cleanup(func() { close(hold) }) // the held handler has not read the body, so it does not see the cancel
	body := messagesBody(false, 1024)
	ctx, cancel := context.WithCancel(t.Context())
	req := f.request(ctx, t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(body))
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	waitFor(t, "the call reaching the upstream", func() bool { return f.rec.arrivals.Load() == 1 })
	cancel()
	<-errc
	ledger := f.waitDebits(t, userID, 1)
	price, _ := budget.DefaultPrices().PriceFor(model, time.Now())
	want := price.WorstCase(int64(len(body))/3+1, 0)
	if len(ledger) != 2 || ledger[1].Amount != want || ledger[1].Outcome != "no_usage" {
		t.Errorf("ledger: got %+v, want a debit of the input-side worst case %d with outcome no_usage", ledger, want)
	}
}

// TestGatewayRefusesAmbiguousPricedMembers guards against case M2: escaped
// member names got past pricing (a 1-token haiku reservation for a call the
// upstream ran as 64000 tokens of opus). Every spelling that common parsers
// read differently from the gateway is refused before anything is reserved.
func TestGatewayRefusesAmbiguousPricedMembers(t *testing.T) {
	f := newFixture(t)
	if err := f.budget.SetUserLimit(t.Context(), userID, budget.NanoPerUSD/2); err != nil {
		t.Fatal(err)
	}
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	for _, body := range []string{
		`{"model":"claude-3-haiku-20240307","max_tokens":1,"stream":true,"max\u005ftokens":64000,"mod\u0065l":"claude-opus-4-1-20250805",` + msgs + `}`,
		`{"model":"claude-3-haiku-20240307","max_tokens":1,"MAX_TOKENS":64000,` + msgs + `}`,
		`{"model":"claude-3-haiku-20240307","max_tokens":1,"max_to\u212aens":64000,` + msgs + `}`,
		`{"model":"claude-3-haiku-20240307","Model":"claude-opus-4-1-20250805","max_tokens":1,` + msgs + `}`,
		`{"model":"claude-3-haiku-20240307","max_tokens":1,"tools":[{"type":"custom","name":"x","typ\u0065":"web_search_20250305"}],` + msgs + `}`,
		`{"model":"claude-3-haiku-20240307","max_tokens":1,"tools":[{"type":"web_search_20250305","name":"w","max_uses":1,"max_uses":500}],` + msgs + `}`,
		`{"model":"claude-3-haiku-20240307","max_tokens":2000,"thinking":{"type":"enabled","budget_tokens":1024},"thinking":{"type":"enabled","budget_tokens":1500},` + msgs + `}`,
		`{"model":"claude-3-haiku-20240307\ud800","max_tokens":1,` + msgs + `}`,
	} {
		got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(body)))
		env := checkEnvelope(t, got, http.StatusBadRequest, anthropic.ErrInvalidRequest)
		if !strings.Contains(env.Error.Message, "request body") {
			t.Errorf("%s: message %q, want it to name the request body", body, env.Error.Message)
		}
	}
	if n := f.rec.arrivals.Load(); n != 0 {
		t.Errorf("upstream: got %d calls, want none", n)
	}
	if l := f.ledger(t, userID); len(l) != 0 {
		t.Errorf("ledger: got %+v, want nothing reserved", l)
	}
}

// serverToolUpstream answers every call with a JSON message whose usage is
// what a server-tool call reports (case M3): 25 000 input tokens (search
// results count as input), 500 output, and 3 searches when the request
// declares web search.
type serverToolUpstream struct{}

func (serverToolUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var req struct{ Model string }
	json.Unmarshal(b, &req)
	searches := 0
	if bytes.Contains(b, []byte("web_search")) {
		searches = 3
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"found it"}],`+
		`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":25000,"output_tokens":500,"server_tool_use":{"web_search_requests":%d}}}`, req.Model, searches)
}

// TestGatewayServerToolsCannotOverspend guards against case M3: a small
// request declaring server tools was reserved as if its body were its whole
// input, while search results added 25 000 input tokens and searches cost a
// fee: six calls at once against a limit of three reservations spent 6.5
// times the limit. Whatever server tools a request declares, its
// reservation covers what the upstream bills, and concurrent calls never
// spend past the limit (SQLite and PostgreSQL).
func TestGatewayServerToolsCannotOverspend(t *testing.T) {
	const haiku = "claude-3-haiku-20240307"
	decls := map[string]string{
		"web_search max_uses 5":   `"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":5}]`,
		"web_search without max":  `"tools":[{"name":"Read","input_schema":{}},{"type":"web_search_20250305","name":"web_search"}]`,
		"web_fetch":               `"tools":[{"type":"web_fetch_20250910","name":"web_fetch","max_uses":2,"max_content_tokens":20000}]`,
		"code_execution":          `"tools":[{"type":"code_execution_20250825","name":"code_execution"}]`,
		"unknown server tool":     `"tools":[{"type":"future_tool_20270101","name":"future"}]`,
		"mcp connector":           `"mcp_servers":[{"type":"url","url":"https://mcp.example.com/sse","name":"m"}]`,
		"search and fetch, small": `"tools":[{"type":"web_search_20250305","name":"s","max_uses":1},{"type":"web_fetch_20250910","name":"f","max_uses":1}]`,
	}
	for _, store := range []string{"sqlite", "postgres"} {
		t.Run(store, func(t *testing.T) {
			f := newFixtureWith(t, fixtureOptions{postgres: store == "postgres", upstream: serverToolUpstream{}})
			i := 0
			for name, decl := range decls {
				i++
				body := `{"model":"` + haiku + `","max_tokens":1024,` + decl + `,"messages":[{"role":"user","content":"search the web"}]}`
				probe, user := fmt.Sprintf("probe-%d", i), fmt.Sprintf("user-%d", i)
				if got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, probe), strings.NewReader(body))); got.status != http.StatusOK {
					t.Fatalf("%s: probe got %d %s, want 200", name, got.status, got.body)
				}
				pl := f.waitDebits(t, probe, 1)
				reserved, cost := pl[0].Amount, pl[1].Amount
				if cost > reserved {
					t.Errorf("%s: the call cost %d nano-USD, more than its reservation %d", name, cost, reserved)
				}
				limit := 3 * reserved
				if err := f.budget.SetUserLimit(t.Context(), user, limit); err != nil {
					t.Fatal(err)
				}
				hold := make(chan struct{})
				f.rec.hold.Store(&hold)
				before := f.rec.arrivals.Load()
				const n = 6
				statuses := make(chan int, n)
				tok := f.workerToken(t, convID, user)
				for range n {
					f.sendAsync(t, tok, body, statuses)
				}
				got := map[int]int{}
				waitFor(t, name+": every call admitted or refused", func() bool {
					for {
						select {
						case s := <-statuses:
							got[s]++
							continue
						default:
						}
						return int(f.rec.arrivals.Load()-before)+got[http.StatusTooManyRequests] == n
					}
				})
				close(hold)
				f.rec.hold.Store(nil)
				for sum := 0; sum < n; sum = got[200] + got[429] + got[-1] {
					got[<-statuses]++
				}
				f.waitDebits(t, user, got[http.StatusOK])
				sp := f.spend(t, user)
				if sp.Spent > limit || got[http.StatusOK] > 3 {
					t.Errorf("%s: %v; spent %d nano-USD of a limit of %d (3 reservations), want at most the limit", name, got, sp.Spent, limit)
				}
			}
		})
	}
}

// lowerUpstream answers every call with a JSON message whose output uses
// all of the max_tokens it received: the worst case of every call.
type lowerUpstream struct {
	mu        sync.Mutex
	maxTokens []int64 // as received, read by encoding/json
}

func (u *lowerUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var req struct {
		Model     string
		MaxTokens int64 `json:"max_tokens"`
	}
	json.Unmarshal(b, &req)
	u.mu.Lock()
	u.maxTokens = append(u.maxTokens, req.MaxTokens)
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"..."}],`+
		`"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":20,"output_tokens":%d}}`, req.Model, req.MaxTokens)
}

// TestGatewayLowersMaxTokensToFitBudget: a user whose whole budget (0.5
// USD) is below one call's worst case (64 000 output tokens of opus 4.1,
// 4.8 USD) used to be refused every call. The call is admitted with
// max_tokens lowered to what the budget covers, the answer says so, and
// the upstream gets exactly that max_tokens; below MinLoweredMaxTokens the
// call is refused.
func TestGatewayLowersMaxTokensToFitBudget(t *testing.T) {
	const opus = "claude-opus-4-1-20250805"
	up := &lowerUpstream{}
	f := newFixtureWith(t, fixtureOptions{upstream: up})
	limit := budget.NanoPerUSD / 2
	if err := f.budget.SetUserLimit(t.Context(), userID, limit); err != nil {
		t.Fatal(err)
	}
	body := `{"model":"` + opus + `","max_tokens":64000,"messages":[{"role":"user","content":"write a lot"}]}`
	got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(body)))
	if got.status != http.StatusOK {
		t.Fatalf("got %d %s, want 200 with max_tokens lowered", got.status, got.body)
	}
	n, err := strconv.ParseInt(got.header.Get(gateway.HeaderMaxTokensLowered), 10, 64)
	if err != nil || n < gateway.MinLoweredMaxTokens || n >= 64000 {
		t.Fatalf("%s: got %q, want the lowered max_tokens", gateway.HeaderMaxTokensLowered, got.header.Get(gateway.HeaderMaxTokensLowered))
	}
	if len(up.maxTokens) != 1 || up.maxTokens[0] != n {
		t.Errorf("upstream read max_tokens %v, want [%d]", up.maxTokens, n)
	}
	ledger := f.waitDebits(t, userID, 1)
	price, _ := budget.DefaultPrices().PriceFor(opus, time.Now())
	prompt := int64(len(body))/3 + 1
	if r := ledger[0].Amount; r > limit || price.WorstCase(prompt, n+1) <= limit {
		t.Errorf("reservation %d for max_tokens %d: want the largest max_tokens whose worst case fits the limit %d", r, n, limit)
	}
	if sp := f.spend(t, userID); sp.Spent > limit {
		t.Errorf("spent %d, over the limit %d", sp.Spent, limit)
	}
	// What is left now covers fewer than MinLoweredMaxTokens: refused.
	got = do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, userID), strings.NewReader(body)))
	env := checkEnvelope(t, got, http.StatusTooManyRequests, anthropic.ErrRateLimit)
	if env.Error.Details["error_code"] != "budget_exceeded" || len(up.maxTokens) != 1 {
		t.Errorf("below the minimum: got %+v and %d upstream calls, want budget_exceeded and no call", env.Error, len(up.maxTokens))
	}
}

// TestGatewayLoweredCallsCannotOverspend fires calls at once for a user
// whose budget is below one worst case, each using all of the max_tokens it
// is forwarded with: lowering keeps admitted spend within the limit.
func TestGatewayLoweredCallsCannotOverspend(t *testing.T) {
	for _, store := range []string{"sqlite", "postgres"} {
		t.Run(store, func(t *testing.T) {
			up := &lowerUpstream{}
			f := newFixtureWith(t, fixtureOptions{postgres: store == "postgres", upstream: up})
			limit := budget.NanoPerUSD / 2
			if err := f.budget.SetUserLimit(t.Context(), userID, limit); err != nil {
				t.Fatal(err)
			}
			body := `{"model":"claude-opus-4-1-20250805","max_tokens":64000,"messages":[{"role":"user","content":"write a lot"}]}`
			tok := f.workerToken(t, convID, userID)
			const n = 8
			var wg sync.WaitGroup
			codes := make([]int, n)
			for i := range n {
				req := f.request(t.Context(), t, http.MethodPost, "/v1/messages", tok, strings.NewReader(body))
				wg.Go(func() {
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					codes[i] = resp.StatusCode
				})
			}
			wg.Wait()
			ok := 0
			for _, c := range codes {
				if c == http.StatusOK {
					ok++
				}
			}
			if ok == 0 {
				t.Fatalf("statuses %v: want at least one call admitted with max_tokens lowered", codes)
			}
			f.waitDebits(t, userID, ok)
			if sp := f.spend(t, userID); sp.Spent > limit {
				t.Errorf("statuses %v: spent %d nano-USD, over the limit %d", codes, sp.Spent, limit)
			}
		})
	}
}

// TestGatewayPricesDevUpstreamAsItself guards against case F3: the
// development upstream's answers were priced as the model the CLI asked
// for (an Opus-class price, 0.06-0.12 USD for a trivial turn). A demo turn
// of about 27 000 input tokens costs a fraction of a cent, and a call that
// names the development upstream's model reserves a fraction of a cent.
func TestGatewayPricesDevUpstreamAsItself(t *testing.T) {
	f := newFixture(t)
	prompt := strings.Repeat("lorem ipsum ", 9000) // about 27 000 tokens by the upstream's estimate
	for i, m := range []string{"claude-opus-4-1-20250805", devupstream.ModelID} {
		user := fmt.Sprintf("demo-%d", i)
		body := `{"model":"` + m + `","max_tokens":32000,"stream":true,"messages":[{"role":"user","content":"` + prompt + `"}]}`
		if got := do(t, f.request(t.Context(), t, http.MethodPost, "/v1/messages", f.workerToken(t, convID, user), strings.NewReader(body))); got.status != http.StatusOK {
			t.Fatalf("%s: got %d %s, want 200", m, got.status, got.body)
		}
		l := f.waitDebits(t, user, 1)
		d := l[len(l)-1]
		if d.Model != devupstream.ModelID || d.InputTokens < 20000 || d.Amount <= 0 || d.Amount >= budget.NanoPerUSD/100 {
			t.Errorf("%s: debit %+v, want model %s, a demo-sized prompt, and under one cent", m, d, devupstream.ModelID)
		}
		if m == devupstream.ModelID && l[0].Amount >= budget.NanoPerUSD/100 {
			t.Errorf("%s: reserved %d nano-USD, want under one cent", m, l[0].Amount)
		}
	}
}
