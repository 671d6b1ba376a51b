package e2e

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/budget"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlstore"
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
