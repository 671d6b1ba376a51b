package gateway_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/gateway"
	"github.com/talkide/talkide/internal/token"
)

// pendingBudget predicts every call and lets the test end each ticket.
type pendingBudget struct {
	tickets chan func(budget.Reservation, error)
	debits  atomic.Int32
}

func (b *pendingBudget) PreCallCheckAsync(_ context.Context, c budget.Call) *budget.Ticket {
	t, end := budget.NewPendingTicket()
	b.tickets <- end
	return t
}

func (b *pendingBudget) PostCallDebit(context.Context, budget.Reservation, budget.NanoUSD, budget.Debit) error {
	b.debits.Add(1)
	return nil
}

// pipelineGateway serves a gateway over up with a pendingBudget.
func pipelineGateway(t *testing.T, up http.Handler) (*pendingBudget, func() *http.Request) {
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	upURL, _ := url.Parse(upSrv.URL)
	master, _ := token.NewMasterKey("k")
	key := master.Derive(token.PurposeGateway, "", "")
	b := &pendingBudget{tickets: make(chan func(budget.Reservation, error), 1)}
	gw := gateway.New(gateway.Config{Upstream: upURL, Keys: []token.Key{key}, Budget: b, Logger: slog.New(slog.DiscardHandler)})
	srv := httptest.NewServer(gw)
	t.Cleanup(func() { srv.Close(); gw.Close() })
	tok, err := token.NewSigner(token.PurposeGateway, key).Sign(token.Claims{Tenant: tenant, Env: env, Conversation: convID, User: userID}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return b, func() *http.Request {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+contract.PathGatewayPrefix+"/v1/messages", strings.NewReader(messagesBody(false, 64)))
		req.Header.Set(contract.HeaderWorkerToken, tok)
		req.Header.Set("Content-Type", "application/json")
		return req
	}
}

func send(req *http.Request) <-chan result {
	out := make(chan result, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- result{status: -1, body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		out <- result{status: resp.StatusCode, header: resp.Header, body: b}
	}()
	return out
}

// TestGatewayHoldsAnswerUntilReservationIsDurable: a call admitted on a
// prediction is forwarded at once, but no byte of the upstream's answer
// reaches the client before the reservation has committed.
func TestGatewayHoldsAnswerUntilReservationIsDurable(t *testing.T) {
	answered := make(chan struct{}, 1)
	canned := newCannedUpstream()
	b, newReq := pipelineGateway(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		canned.ServeHTTP(w, r)
		answered <- struct{}{}
	}))
	got := send(newReq())
	end := <-b.tickets
	select {
	case <-answered: // forwarded while the reservation commits
	case <-time.After(10 * time.Second):
		t.Fatal("call not forwarded while its reservation was committing")
	}
	select {
	case r := <-got:
		t.Fatalf("client got an answer (%d %s) before the reservation was durable", r.status, r.body)
	case <-time.After(200 * time.Millisecond):
	}
	end(budget.Reservation{ID: "r1", UserID: userID, Amount: 1000}, nil)
	r := <-got
	if r.status != http.StatusOK || string(r.body) != string(canned.json) {
		t.Fatalf("answer: got %d %q, want 200 and the upstream's bytes", r.status, r.body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.debits.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := b.debits.Load(); n != 1 {
		t.Errorf("debits: got %d, want 1", n)
	}
}

// TestGatewayLateRefusalCancelsUpstreamCall: a call admitted on a
// prediction that the database then refuses is cancelled at the upstream
// at once, the client gets the budget refusal (not a byte of the answer),
// and nothing is debited.
func TestGatewayLateRefusalCancelsUpstreamCall(t *testing.T) {
	arrived, cancelled := make(chan struct{}, 1), make(chan struct{}, 1)
	b, newReq := pipelineGateway(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // a server notices a closed connection once the body is read
		arrived <- struct{}{}
		select {
		case <-r.Context().Done():
			cancelled <- struct{}{}
		case <-time.After(30 * time.Second): // the model thinking
			io.WriteString(w, `{"type":"message","usage":{"input_tokens":1,"output_tokens":1}}`)
		}
	}))
	got := send(newReq())
	end := <-b.tickets
	<-arrived
	end(budget.Reservation{}, &budget.DenyError{UserID: userID, Period: "2026-11", Limit: 100, Committed: 90, Needed: 20})
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10 s of the refusal: the upstream call was not cancelled")
	}
	env := checkEnvelope(t, r, http.StatusTooManyRequests, anthropic.ErrRateLimit)
	if r.header.Get("x-should-retry") != "false" || !strings.Contains(env.Error.Message, "budget exhausted") {
		t.Errorf("refusal: x-should-retry %q, message %q; want false and the budget message", r.header.Get("x-should-retry"), env.Error.Message)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream call was not cancelled")
	}
	time.Sleep(50 * time.Millisecond)
	if n := b.debits.Load(); n != 0 {
		t.Errorf("debits: got %d, want none for a refused call", n)
	}
}

// TestGatewayRelaysNo1xxBeforeReservationIsDurable: an informational
// answer (103 Early Hints) the upstream sends while a predicted
// reservation is still committing does not reach the client either.
func TestGatewayRelaysNo1xxBeforeReservationIsDurable(t *testing.T) {
	b, newReq := pipelineGateway(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Link", "</hint>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	got1xx := make(chan int, 1)
	req := newReq()
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
			got1xx <- code
			return nil
		},
	}))
	got := send(req)
	end := <-b.tickets
	select {
	case code := <-got1xx:
		t.Errorf("client got the upstream's %d before the reservation was durable", code)
	case <-time.After(300 * time.Millisecond):
	}
	end(budget.Reservation{}, &budget.DenyError{UserID: userID, Period: "2026-11", Limit: 1, Committed: 1, Needed: 1})
	if r := <-got; r.status != http.StatusTooManyRequests {
		t.Errorf("status %d, want 429", r.status)
	}
}
