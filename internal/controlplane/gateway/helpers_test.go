package gateway_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/gateway"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/pgtest"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
)

const (
	upstreamKey = "sk-up"
	tenant      = "demo"
	env         = "dev"
	convID      = "conv-1"
	userID      = "alice"
	model       = "claude-sonnet-4-5-20250929"
)

// answer is what the upstream wrote for one request, as seen on its side
// of the wire.
type answer struct {
	status int
	header http.Header // the headers the upstream handler set
	body   []byte
}

// recordingUpstream wraps the development upstream: it adds fixed headers
// to every answer (rate-limit headers the real API sends), tees every byte
// the upstream writes, and can hold requests at the door.
type recordingUpstream struct {
	next  http.Handler
	extra http.Header
	// noRecord skips keeping answer bodies.
	noRecord bool

	arrivals atomic.Int32
	// hold, when set, is waited on (or the request's end) before a request
	// is passed to the upstream.
	hold atomic.Pointer[chan struct{}]

	mu      sync.Mutex
	answers []answer // guarded by mu
}

func (u *recordingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.arrivals.Add(1)
	if h := u.hold.Load(); h != nil {
		select {
		case <-*h:
		case <-r.Context().Done():
			return
		}
	}
	for k, vs := range u.extra {
		w.Header()[k] = vs
	}
	tw := &teeWriter{ResponseWriter: w, discard: u.noRecord}
	defer func() { // also runs when the upstream aborts the connection (panic)
		u.mu.Lock()
		defer u.mu.Unlock()
		u.answers = append(u.answers, answer{status: tw.status, header: tw.header, body: tw.buf.Bytes()})
	}()
	u.next.ServeHTTP(tw, r)
}

func (u *recordingUpstream) answered() []answer {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]answer(nil), u.answers...)
}

type teeWriter struct {
	http.ResponseWriter
	status  int
	header  http.Header
	buf     bytes.Buffer
	discard bool
}

func (w *teeWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		w.header = w.Header().Clone()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *teeWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.discard {
		w.buf.Write(p)
	}
	return w.ResponseWriter.Write(p)
}

func (w *teeWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *teeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

type fixture struct {
	db     *controlstore.DB
	budget *budget.Service
	master token.MasterKey
	up     *devupstream.Server
	rec    *recordingUpstream
	gw     *httptest.Server
	logs   *platformtest.LogBuffer
}

// fixtureOptions vary a fixture.
type fixtureOptions struct {
	// postgres runs the budget on PostgreSQL instead of SQLite.
	postgres bool
	budget   budget.Config
	prices   *budget.PriceTable
	// upstream, when set, replaces the development upstream.
	upstream http.Handler
	metrics  *gateway.Metrics
	// noRecord keeps the upstream's answers out of memory (big streams).
	noRecord bool
	// clientGoneWait is the gateway's Config.ClientGoneWait.
	clientGoneWait time.Duration
}

func newFixture(t testing.TB) *fixture { return newFixtureWith(t, fixtureOptions{}) }

func newFixtureWith(t testing.TB, o fixtureOptions) *fixture {
	t.Helper()
	var db *controlstore.DB
	var err error
	if o.postgres {
		db, err = controlstore.OpenPostgres(t.Context(), pgtest.SchemaURL(t), 70)
	} else {
		db, err = controlstore.OpenSQLite(t.Context(), filepath.Join(t.TempDir(), "cp.db"))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	master, err := token.NewMasterKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	up := devupstream.New(devupstream.Config{APIKey: upstreamKey})
	var next http.Handler = up
	if o.upstream != nil {
		next = o.upstream
	}
	rec := &recordingUpstream{next: next, noRecord: o.noRecord, extra: http.Header{
		"Anthropic-Ratelimit-Requests-Limit":     {"50"},
		"Anthropic-Ratelimit-Requests-Remaining": {"49"},
		"Anthropic-Ratelimit-Tokens-Reset":       {"2026-11-30T12:00:00Z"},
		"Anthropic-Organization-Id":              {"org-test"},
	}}
	upSrv := httptest.NewServer(rec)
	t.Cleanup(upSrv.Close)
	upURL, err := url.Parse(upSrv.URL)
	if err != nil {
		t.Fatal(err)
	}
	svc := budget.NewService(db, o.budget)
	logs := &platformtest.LogBuffer{}
	gw := gateway.New(gateway.Config{
		Upstream:       upURL,
		APIKey:         upstreamKey,
		Keys:           []token.Key{master.Derive(token.PurposeGateway, "", "")},
		Budget:         svc,
		Prices:         o.prices,
		Metrics:        o.metrics,
		ClientGoneWait: o.clientGoneWait,
		Logger:         slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	gwSrv := httptest.NewServer(gw)
	t.Cleanup(func() { gwSrv.Close(); gw.Close(); svc.Close() })
	return &fixture{db: db, budget: svc, master: master, up: up, rec: rec, gw: gwSrv, logs: logs}
}

// workerToken signs a WorkerToken as the mint would.
func (f *fixture) workerToken(t testing.TB, conv, user string) string {
	t.Helper()
	tok, err := token.NewSigner(token.PurposeGateway, f.master.Derive(token.PurposeGateway, "", "")).
		Sign(token.Claims{Tenant: tenant, Env: env, Conversation: conv, User: user}, token.WorkerTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func messagesBody(stream bool, maxTokens int64) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":%t,"messages":[{"role":"user","content":"Say hello."}]}`, model, maxTokens, stream)
}

// request builds a call to the gateway at apiPath (e.g. "/v1/messages").
// sendAsync sends a messages call with tok and body in the background and
// puts its status on out (-1 when the call itself failed), once its answer
// was read to the end.
func (f *fixture) sendAsync(t *testing.T, tok, body string, out chan<- int) {
	t.Helper()
	req := f.request(t.Context(), t, http.MethodPost, "/v1/messages", tok, strings.NewReader(body))
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- -1
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out <- resp.StatusCode
	}()
}

func (f *fixture) request(ctx context.Context, t testing.TB, method, apiPath, tok string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, f.gw.URL+contract.PathGatewayPrefix+apiPath, body)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set(contract.HeaderWorkerToken, tok)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("anthropic-version", "2023-06-01")
	return req
}

type result struct {
	status int
	header http.Header
	body   []byte
}

// do sends req and reads the whole answer.
func do(t testing.TB, req *http.Request) result {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read answer of %s %s: %v", req.Method, req.URL.Path, err)
	}
	return result{status: resp.StatusCode, header: resp.Header, body: b}
}

// checkEnvelope asserts Anthropic's error envelope with error type typ and a
// request id matching the request-id header; it returns the envelope.
func checkEnvelope(t testing.TB, r result, status int, typ string) anthropic.ErrorEnvelope {
	t.Helper()
	if r.status != status {
		t.Fatalf("status: got %d (%s), want %d", r.status, r.body, status)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type: got %q, want application/json", ct)
	}
	var env anthropic.ErrorEnvelope
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		t.Fatalf("body %s: got %v, want Anthropic's error envelope", r.body, err)
	}
	if env.Type != "error" || env.Error.Type != typ || env.Error.Message == "" {
		t.Errorf("envelope: got type %q error.type %q message %q, want \"error\", %q, a message", env.Type, env.Error.Type, env.Error.Message, typ)
	}
	if env.RequestID == "" || env.RequestID != r.header.Get("request-id") {
		t.Errorf("request_id: got %q in body, %q in header; want the same, non-empty", env.RequestID, r.header.Get("request-id"))
	}
	// Claude Code shows only the message: every refusal of the gateway's
	// (its own, an upstream it cannot reach, a panic) ends with the id.
	if !strings.HasSuffix(env.Error.Message, " (request "+env.RequestID+")") {
		t.Errorf("message %q does not end with the request id %q", env.Error.Message, env.RequestID)
	}
	return env
}

// ledgerRow is one row of budget_ledger.
type ledgerRow struct {
	Kind           string
	ReservationID  string
	ConversationID string
	Model          string
	RequestID      string
	InputTokens    int64
	OutputTokens   int64
	CacheWrite5m   int64
	CacheWrite1h   int64
	CacheRead      int64
	Amount         int64
	Outcome        string
}

func (f *fixture) ledger(t testing.TB, user string) []ledgerRow {
	t.Helper()
	entries, err := f.budget.Ledger(context.Background(), budget.LedgerQuery{UserID: user})
	if err != nil {
		t.Fatal(err)
	}
	var out []ledgerRow
	for _, e := range entries {
		out = append(out, ledgerRow{Kind: e.Kind, ReservationID: e.ReservationID, ConversationID: e.ConversationID, Model: e.Model,
			RequestID: e.RequestID, InputTokens: e.InputTokens, OutputTokens: e.OutputTokens, CacheWrite5m: e.CacheWrite5m,
			CacheWrite1h: e.CacheWrite1h, CacheRead: e.CacheRead, Amount: e.Amount, Outcome: e.Outcome})
	}
	return out
}

func (f *fixture) spend(t testing.TB, user string) budget.Spend {
	t.Helper()
	sp, err := f.budget.Spend(context.Background(), user, tenant)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatal(err)
	}
	return sp
}

// waitSettled polls until user's call is settled (a debit is in the ledger
// and nothing is reserved) or the deadline passes; it returns the ledger.
func (f *fixture) waitSettled(t testing.TB, user string, debits int) []ledgerRow {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		l := f.ledger(t, user)
		n := 0
		for _, r := range l {
			if r.Kind == "debit" {
				n++
			}
		}
		sp := f.spend(t, user)
		if n >= debits && sp.Reserved == 0 {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("call of %s not settled within 2 s: reserved %d nano-USD, %d debits, ledger %+v", user, sp.Reserved, n, l)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFor polls cond until it holds; the deadline only keeps a broken
// gateway from hanging the test, nothing is measured against it.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitDebits polls until user's ledger holds n debits and nothing is
// reserved; it returns the ledger.
func (f *fixture) waitDebits(t testing.TB, user string, n int) []ledgerRow {
	t.Helper()
	var l []ledgerRow
	waitFor(t, fmt.Sprintf("%d debits of %s", n, user), func() bool {
		l = f.ledger(t, user)
		d := 0
		for _, r := range l {
			if r.Kind == "debit" {
				d++
			}
		}
		return d >= n && f.spend(t, user).Reserved == 0
	})
	return l
}

// waitNothingReserved polls until user holds no reservation.
func (f *fixture) waitNothingReserved(t testing.TB, user string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		sp := f.spend(t, user)
		if sp.Reserved == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("reserved for %s: got %d nano-USD 2 s after the call, want 0", user, sp.Reserved)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// costOf prices usage as the gateway must: by the budget's default table.
func costOf(u anthropic.Usage) budget.NanoUSD {
	p, _ := budget.DefaultPrices().PriceFor(u.Model, time.Now())
	return p.Cost(u)
}
