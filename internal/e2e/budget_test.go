package e2e

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
)

// gatewayCalls records the status of every /v1/messages call the gateway
// answered, and can replace the WorkerToken of the first calls.
type gatewayCalls struct {
	mu       sync.Mutex
	statuses []int
	// replace, while > 0, swaps that many calls' token for badToken.
	replace  int
	badToken string
}

func (g *gatewayCalls) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != contract.PathGatewayPrefix+"/v1/messages" {
			h.ServeHTTP(w, r)
			return
		}
		g.mu.Lock()
		if g.replace > 0 {
			g.replace--
			r.Header.Set(contract.HeaderWorkerToken, g.badToken)
		}
		g.mu.Unlock()
		rec := httpapi.NewStatusRecorder(w)
		h.ServeHTTP(rec, r)
		g.mu.Lock()
		g.statuses = append(g.statuses, rec.Status())
		g.mu.Unlock()
	})
}

func (g *gatewayCalls) seen() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.statuses...)
}

// setLimit sets the dev user's spending limit in the platform's database.
func setLimit(t *testing.T, p *platformtest.Platform, user string, limit budget.NanoUSD) {
	t.Helper()
	db, err := controlstore.OpenSQLite(context.Background(), p.DBPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	svc := budget.NewService(db, budget.Config{})
	defer svc.Close()
	if err := svc.SetUserLimit(context.Background(), user, limit); err != nil {
		t.Fatal(err)
	}
}

// TestBudgetDenialReachesTheUserAtOnce runs a turn with the real CLI for a
// user whose budget cannot cover a call: the gateway's 429 with
// x-should-retry: false must end the turn with the gateway's message after
// one call, without the CLI's retries (which, at its backoff, would take
// minutes).
func TestBudgetDenialReachesTheUserAtOnce(t *testing.T) {
	calls := &gatewayCalls{}
	p := platformtest.Start(t, platformtest.Options{Wrap: calls.wrap})
	setLimit(t, p, "dev", 1_000) // 1 µUSD: below any call's worst case
	conv := p.NewConversation()
	s := p.OpenStream(conv, 0)
	start := time.Now()
	p.Send(conv, "hello")
	end := s.Until(5*time.Minute, platformtest.TurnEnd)
	t.Logf("budget denial reached the browser after %s; gateway answers: %v", time.Since(start).Round(time.Millisecond), calls.seen())
	if end.Type != contract.EventTurnFailed {
		t.Fatalf("got %s %s, want turn_failed", end.Type, end.Data)
	}
	f := platformtest.Payload[contract.TurnFailed](t, end)
	if f.APIErrorStatus != http.StatusTooManyRequests || !strings.Contains(f.Message, "TalkIDE budget exhausted") {
		t.Errorf("turn_failed: got %+v, want status 429 and the gateway's budget message", f)
	}
	got := calls.seen()
	if len(got) != 1 || got[0] != http.StatusTooManyRequests {
		t.Errorf("gateway calls: got %v, want exactly one, answered 429 (the CLI must not retry a budget denial)", got)
	}
}

// TestExpiredWorkerTokenIsRecovered hands the gateway an expired WorkerToken
// on the CLI's first model call (as a gateway whose clock runs ahead would
// see it): the 401 asks for a retry, the CLI retries, the worker's local
// proxy mints a fresh token, and the turn completes.
func TestExpiredWorkerTokenIsRecovered(t *testing.T) {
	calls := &gatewayCalls{}
	p := platformtest.Start(t, platformtest.Options{Wrap: calls.wrap})
	conv := p.NewConversation()
	expired, err := token.NewSigner(token.PurposeGateway, p.Master.Derive(token.PurposeGateway, "", "")).
		Sign(token.Claims{Tenant: p.Tenant, Env: p.Env, Conversation: conv, User: "dev"}, -time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	calls.mu.Lock()
	calls.replace, calls.badToken = 1, expired
	calls.mu.Unlock()
	s := p.OpenStream(conv, 0)
	start := time.Now()
	p.Send(conv, "hello after an expired token")
	end := s.Until(5*time.Minute, platformtest.TurnEnd)
	t.Logf("turn ended after %s; gateway answers: %v", time.Since(start).Round(time.Millisecond), calls.seen())
	if end.Type != contract.EventTurnCompleted {
		t.Fatalf("got %s %s, want turn_completed after the retry with a fresh token", end.Type, end.Data)
	}
	got := calls.seen()
	if len(got) < 2 || got[0] != http.StatusUnauthorized || got[1] != http.StatusOK {
		t.Errorf("gateway calls: got %v, want 401 (expired) then 200 (fresh token)", got)
	}
}

// TestTurnNamesItsBookedCalls guards the second stumble of issue 29: each
// turn showed the CLI's list-price estimate while the conversation and the
// month showed what the gateway booked, 300 times less, with nothing tying
// the two. A turn's end names its model calls (request_ids) and the browser
// API lists what the gateway booked for each: with the real CLI, a turn of
// two calls (a tool call, then the answer) names both, each is booked, and
// their sum is what the conversation was charged.
func TestTurnNamesItsBookedCalls(t *testing.T) {
	p := platformtest.Start(t, platformtest.Options{})
	conv := p.NewConversation()
	s := p.OpenStream(conv, 0)
	p.Send(conv, "please run `echo booked`")
	end := s.Until(90*time.Second, platformtest.TurnEnd)
	if end.Type != contract.EventTurnCompleted {
		t.Fatalf("got %s %s, want turn_completed", end.Type, end.Data)
	}
	done := platformtest.Payload[contract.TurnCompleted](t, end)
	if len(done.RequestIDs) < 2 {
		t.Fatalf("request_ids %v, want the turn's two calls at least", done.RequestIDs)
	}
	q := url.Values{"request_id": done.RequestIDs}
	var booked struct {
		Calls []struct {
			RequestID     string `json:"request_id"`
			BookedNanoUSD int64  `json:"booked_nano_usd"`
			Outcome       string `json:"outcome"`
		} `json:"calls"`
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		booked.Calls = nil
		if st := p.Do("GET", "/api/conversations/"+conv+"/calls?"+q.Encode(), nil, &booked); st != http.StatusOK {
			t.Fatalf("calls: %d", st)
		}
		if len(booked.Calls) == len(done.RequestIDs) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // a call settles just after its answer
	}
	if len(booked.Calls) != len(done.RequestIDs) {
		t.Fatalf("booked calls %+v, want one for each of %v", booked.Calls, done.RequestIDs)
	}
	var sum int64
	for _, c := range booked.Calls {
		if c.BookedNanoUSD <= 0 || c.Outcome != "complete" {
			t.Errorf("call %+v: want a complete call booked above zero", c)
		}
		sum += c.BookedNanoUSD
	}
	var got struct {
		SpentNanoUSD int64 `json:"spent_nano_usd"`
	}
	if st := p.Do("GET", "/api/conversations/"+conv, nil, &got); st != http.StatusOK {
		t.Fatalf("conversation: %d", st)
	}
	if got.SpentNanoUSD != sum {
		t.Errorf("the conversation was charged %d nano-USD, its turn's calls were booked %d", got.SpentNanoUSD, sum)
	}
}
