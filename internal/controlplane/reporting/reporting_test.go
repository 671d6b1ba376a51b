package reporting

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/token"
)

func openStore(t *testing.T) *Store {
	t.Helper()
	db, err := controlstore.OpenSQLite(t.Context(), filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return NewStore(db)
}

var (
	devScope  = Scope{Tenant: "demo", Env: "dev", Conversation: "c1", User: "u1"}
	prodScope = Scope{Tenant: "demo", Env: "prod", Conversation: "c9", User: "u1"}
)

func TestIssueWritesAreIdempotent(t *testing.T) {
	s := openStore(t)
	ctx := t.Context()
	c := contract.IssueCreate{IdempotencyKey: "c1:mcp:1", Title: "the build is broken"}
	first, err := s.CreateIssue(ctx, devScope, c, "h1")
	if err != nil {
		t.Fatal(err)
	}
	if first.Duplicate || first.Issue.Number != 1 || first.Issue.State != contract.IssueOpen {
		t.Fatalf("first create: %+v", first)
	}
	again, err := s.CreateIssue(ctx, devScope, c, "h1")
	if err != nil {
		t.Fatal(err)
	}
	if !again.Duplicate || again.Issue.Number != 1 {
		t.Errorf("retried create: got %+v, want the first answer with duplicate set", again)
	}
	if _, err := s.CreateIssue(ctx, devScope, contract.IssueCreate{IdempotencyKey: "c1:mcp:1", Title: "other"}, "h2"); !errors.Is(err, ErrKeyReused) {
		t.Errorf("key reused for another body: got %v, want ErrKeyReused", err)
	}
	second, err := s.CreateIssue(ctx, devScope, contract.IssueCreate{IdempotencyKey: "c1:mcp:2", Title: "second"}, "h3")
	if err != nil || second.Issue.Number != 2 {
		t.Fatalf("second issue: %+v, %v", second, err)
	}
	list, err := s.ListIssues(ctx, "demo", "dev", StateAll, 0, 0)
	if err != nil || len(list) != 2 || list[0].Number != 2 || list[1].Number != 1 {
		t.Fatalf("list: %+v, %v", list, err)
	}

	closed := contract.IssueClosed
	up, err := s.UpdateIssue(ctx, devScope, 1, contract.IssueUpdate{IdempotencyKey: "c1:mcp:3", State: &closed}, "h4")
	if err != nil || up.Issue.State != contract.IssueClosed || up.Issue.Title != "the build is broken" {
		t.Fatalf("update: %+v, %v", up, err)
	}
	for range 2 {
		if _, err := s.CommentIssue(ctx, devScope, 1, contract.IssueComment{IdempotencyKey: "c1:mcp:4", Body: "fixed in main"}, "h5"); err != nil {
			t.Fatal(err)
		}
	}
	is, err := s.Issue(ctx, "demo", "dev", 1)
	if err != nil || len(is.Comments) != 1 || is.Comments[0].Seq != 1 || is.Comments[0].Body != "fixed in main" {
		t.Fatalf("issue with comments: %+v, %v", is, err)
	}
	open, _ := s.ListIssues(ctx, "demo", "dev", contract.IssueOpen, 0, 0)
	if len(open) != 1 || open[0].Number != 2 {
		t.Errorf("open issues: %+v", open)
	}
}

// TestIssuesStayInTheirTenantEnv guards against a worker touching another
// tenant-env's issues through the store: numbers are per tenant-env and a
// scope sees only its own.
func TestIssuesStayInTheirTenantEnv(t *testing.T) {
	s := openStore(t)
	ctx := t.Context()
	if _, err := s.CreateIssue(ctx, devScope, contract.IssueCreate{IdempotencyKey: "k1", Title: "dev issue"}, "h"); err != nil {
		t.Fatal(err)
	}
	title := "hijacked"
	if _, err := s.UpdateIssue(ctx, prodScope, 1, contract.IssueUpdate{IdempotencyKey: "k2", Title: &title}, "h"); !errors.Is(err, ErrNotFound) {
		t.Errorf("prod scope updating dev's issue 1: got %v, want ErrNotFound", err)
	}
	if _, err := s.CommentIssue(ctx, prodScope, 1, contract.IssueComment{IdempotencyKey: "k3", Body: "x"}, "h"); !errors.Is(err, ErrNotFound) {
		t.Errorf("prod scope commenting dev's issue 1: got %v, want ErrNotFound", err)
	}
	p, err := s.CreateIssue(ctx, prodScope, contract.IssueCreate{IdempotencyKey: "k1", Title: "prod issue"}, "h")
	if err != nil || p.Duplicate || p.Issue.Number != 1 || p.Issue.Env != "prod" {
		t.Fatalf("prod's first issue (same key as dev's): %+v, %v", p, err)
	}
	dev, _ := s.Issue(ctx, "demo", "dev", 1)
	if dev.Title != "dev issue" {
		t.Errorf("dev issue changed: %+v", dev)
	}
}

func TestConcurrentCreatesGetDistinctNumbers(t *testing.T) {
	s := openStore(t)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Go(func() {
			sc := devScope
			sc.Conversation = fmt.Sprintf("c%d", i%3)
			_, err := s.CreateIssue(t.Context(), sc, contract.IssueCreate{IdempotencyKey: fmt.Sprintf("k%d", i), Title: "t"}, "h")
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	list, _ := s.ListIssues(t.Context(), "demo", "dev", StateAll, 0, MaxIssueLimit)
	seen := map[int64]bool{}
	for _, is := range list {
		seen[is.Number] = true
	}
	if len(list) != 20 || len(seen) != 20 || !seen[1] || !seen[20] {
		t.Errorf("got %d issues with numbers %v, want 1..20 once each", len(list), seen)
	}
}

func TestActivityToolCallsAndUsage(t *testing.T) {
	s := openStore(t)
	ctx := t.Context()
	at := time.UnixMilli(1_700_000_000_000).UTC()
	// The result may arrive in any order relative to the use; both merge.
	if _, err := s.RecordToolEvent(ctx, devScope, contract.ToolEventReport{IdempotencyKey: "c1:6:tool", EventID: 6, Time: at.Add(time.Second), Phase: contract.ToolPhaseResult, ToolUseID: "t1", Output: "hi"}, "a"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := s.RecordToolEvent(ctx, devScope, contract.ToolEventReport{IdempotencyKey: "c1:5:tool", EventID: 5, Time: at, Phase: contract.ToolPhaseUse, ToolUseID: "t1", Name: "Bash", Input: json.RawMessage(`{"command":"echo hi"}`)}, "b"); err != nil {
			t.Fatal(err)
		}
	}
	for i := int64(1); i <= 3; i++ {
		ack, err := s.RecordActivity(ctx, devScope, contract.ActivityReport{IdempotencyKey: fmt.Sprintf("c1:%d:activity", i), EventID: i, Time: at, Type: contract.EventTurnStarted, Summary: "s"}, "c")
		if err != nil || ack.Duplicate {
			t.Fatal(ack, err)
		}
	}
	dup, err := s.RecordActivity(ctx, devScope, contract.ActivityReport{IdempotencyKey: "c1:2:activity", EventID: 2, Time: at, Type: contract.EventTurnStarted, Summary: "s"}, "c")
	if err != nil || !dup.Duplicate {
		t.Errorf("retried activity: %+v, %v", dup, err)
	}
	if _, err := s.RecordUsage(ctx, devScope, contract.UsageReport{IdempotencyKey: "c1:7:usage", EventID: 7, Time: at, ClientMessageID: "m1", Outcome: contract.OutcomeCompleted, Usage: contract.Usage{InputTokens: 10, OutputTokens: 2}, CostNanoUSD: 5}, "d"); err != nil {
		t.Fatal(err)
	}
	act, err := s.Activity(ctx, "c1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(act.Activity) != 3 || act.Activity[2].EventID != 3 {
		t.Errorf("activity: %+v", act.Activity)
	}
	if len(act.ToolCalls) != 1 || act.ToolCalls[0].Name != "Bash" || act.ToolCalls[0].Status != "ok" || act.ToolCalls[0].Output != "hi" ||
		string(act.ToolCalls[0].Input) != `{"command":"echo hi"}` || act.ToolCalls[0].StartedAt == nil || act.ToolCalls[0].FinishedAt == nil {
		t.Errorf("tool calls: %+v", act.ToolCalls)
	}
	if len(act.Turns) != 1 || act.Turns[0].Usage.InputTokens != 10 || act.Turns[0].CostNanoUSD != 5 {
		t.Errorf("turns: %+v", act.Turns)
	}
	// A call whose turn ended without its result (a worker restart) is
	// interrupted, not running forever; one in the running turn is running.
	if _, err := s.RecordToolEvent(ctx, devScope, contract.ToolEventReport{IdempotencyKey: "c1:8:tool", EventID: 8, Time: at, Phase: contract.ToolPhaseUse, ToolUseID: "t2", Name: "Bash", Input: json.RawMessage(`{}`)}, "e"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RecordUsage(ctx, devScope, contract.UsageReport{IdempotencyKey: "c1:9:usage", EventID: 9, Time: at, ClientMessageID: "m2", Outcome: "worker_restarted"}, "f"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RecordToolEvent(ctx, devScope, contract.ToolEventReport{IdempotencyKey: "c1:11:tool", EventID: 11, Time: at, Phase: contract.ToolPhaseUse, ToolUseID: "t3", Name: "Bash", Input: json.RawMessage(`{}`)}, "g"); err != nil {
		t.Fatal(err)
	}
	act, _ = s.Activity(ctx, "c1", 0, 0)
	status := map[string]string{}
	for _, c := range act.ToolCalls {
		status[c.ToolUseID] = c.Status
	}
	if status["t2"] != "interrupted" || status["t3"] != "running" {
		t.Errorf("tool statuses: %v, want t2 interrupted and t3 running", status)
	}
	if other, _ := s.Activity(ctx, "c2", 0, 0); len(other.Activity)+len(other.ToolCalls)+len(other.Turns) != 0 {
		t.Errorf("another conversation sees %+v", other)
	}
}

// testServer serves the reporting endpoints as the control plane registers
// them.
type testServer struct {
	*httptest.Server
	master token.MasterKey
	store  *Store
}

func newTestServer(t *testing.T) *testServer {
	t.Helper()
	return newTestServerOn(t, openStore(t))
}

func newTestServerOn(t *testing.T, store *Store) *testServer {
	t.Helper()
	master, _ := token.NewMasterKey("k1")
	h := NewHandler(store, []token.Key{master.Derive(token.PurposeGateway, "", "")}, slog.New(slog.DiscardHandler))
	mux := http.NewServeMux()
	mux.Handle("POST "+contract.PathReportToolEvents, h.ToolEvents())
	mux.Handle("POST "+contract.PathReportUsage, h.Usage())
	mux.Handle("POST "+contract.PathReportActivity, h.Activity())
	mux.Handle("POST "+contract.PathReportBatch, h.Batch())
	mux.Handle("POST "+contract.PathReportIssues, h.CreateIssue())
	mux.Handle("GET "+contract.PathReportIssues, h.ListIssues())
	mux.Handle("GET "+contract.PathReportIssue, h.GetIssue())
	mux.Handle("POST "+contract.PathReportIssueUpdate, h.UpdateIssue())
	mux.Handle("POST "+contract.PathReportIssueComment, h.CommentIssue())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &testServer{Server: srv, master: master, store: store}
}

// workerToken signs a WorkerToken as the mint does.
func (s *testServer) workerToken(t *testing.T, tenant, env, conv string) string {
	t.Helper()
	tok, err := token.NewSigner(token.PurposeGateway, s.master.Derive(token.PurposeGateway, "", "")).
		Sign(token.Claims{Tenant: tenant, Env: env, Conversation: conv, User: "u1"}, token.WorkerTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (s *testServer) do(t *testing.T, tok, method, path, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, s.URL+path, strings.NewReader(body))
	if tok != "" {
		req.Header.Set(contract.HeaderWorkerToken, tok)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestWorkerCannotReportIntoAnotherTenantEnv: whatever a worker puts in the
// body, its reports land in the tenant-env of its WorkerToken, and tokens it
// could make itself are refused.
func TestWorkerCannotReportIntoAnotherTenantEnv(t *testing.T) {
	s := newTestServer(t)
	dev := s.workerToken(t, "demo", "dev", "c1")
	prod := s.workerToken(t, "demo", "prod", "c9")

	// Fields naming a tenant or env in the body are refused outright.
	for _, body := range []string{
		`{"idempotency_key":"k1","title":"x","tenant":"demo","env":"prod"}`,
		`{"idempotency_key":"k1","title":"x","conversation_id":"c9"}`,
	} {
		if st, b := s.do(t, dev, "POST", contract.PathReportIssues, body); st != http.StatusBadRequest {
			t.Errorf("body %s: status %d %s, want 400", body, st, b)
		}
	}
	if st, b := s.do(t, dev, "POST", contract.PathReportIssues, `{"idempotency_key":"k1","title":"dev issue"}`); st != 200 {
		t.Fatalf("create: %d %s", st, b)
	}
	// prod's worker cannot see, update or comment dev's issue 1.
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/api/internal/worker/issues/1", ""},
		{"POST", "/api/internal/worker/issues/1/update", `{"idempotency_key":"k2","title":"hijacked"}`},
		{"POST", "/api/internal/worker/issues/1/comments", `{"idempotency_key":"k3","body":"hijacked"}`},
	} {
		if st, b := s.do(t, prod, c.method, c.path, c.body); st != http.StatusNotFound {
			t.Errorf("prod %s %s: status %d %s, want 404", c.method, c.path, st, b)
		}
	}
	st, b := s.do(t, prod, "GET", contract.PathReportIssues, "")
	if st != 200 || !bytes.Contains(b, []byte(`"issues":[]`)) {
		t.Errorf("prod lists: %d %s, want an empty list", st, b)
	}

	// Tokens a worker holds or could make are refused.
	mk := func(p token.Purpose, key token.Key, c token.Claims) string {
		tok, err := token.NewSigner(p, key).Sign(c, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	other, _ := token.NewMasterKey("k1")
	for name, tok := range map[string]string{
		"identity token": mk(token.PurposeIdentity, s.master.Derive(token.PurposeIdentity, "", ""), token.Claims{Tenant: "demo", Env: "prod"}),
		"request-token key of the worker": mk(token.PurposeGateway, s.master.Derive(token.PurposeWorkerRequest, "demo", "dev"),
			token.Claims{Tenant: "demo", Env: "prod", Conversation: "c9", User: "u1"}),
		"another master key":        mk(token.PurposeGateway, other.Derive(token.PurposeGateway, "", ""), token.Claims{Tenant: "demo", Env: "prod", Conversation: "c9", User: "u1"}),
		"no conversation":           mk(token.PurposeGateway, s.master.Derive(token.PurposeGateway, "", ""), token.Claims{Tenant: "demo", Env: "prod"}),
		"garbage":                   "a.b.c",
		"dev token with prod label": dev[:len(dev)-2] + "xx",
	} {
		st, b := s.do(t, tok, "POST", contract.PathReportIssues, `{"idempotency_key":"k9","title":"forged"}`)
		if st != http.StatusUnauthorized && st != http.StatusForbidden {
			t.Errorf("%s: status %d %s, want 401 or 403", name, st, b)
		}
	}
	if st, _ := s.do(t, "", "POST", contract.PathReportActivity, `{}`); st != http.StatusUnauthorized {
		t.Errorf("no token: status %d, want 401", st)
	}
	if list, _ := s.store.ListIssues(t.Context(), "demo", "prod", StateAll, 0, 0); len(list) != 0 {
		t.Errorf("prod has issues: %+v", list)
	}
	if list, _ := s.store.ListIssues(t.Context(), "demo", "dev", StateAll, 0, 0); len(list) != 1 || list[0].Title != "dev issue" {
		t.Errorf("dev issues: %+v", list)
	}
}

func TestReportEndpoints(t *testing.T) {
	s := newTestServer(t)
	tok := s.workerToken(t, "demo", "dev", "c1")
	now := time.Now().UTC().Format(time.RFC3339Nano)
	bodies := map[string]string{
		contract.PathReportToolEvents: `{"idempotency_key":"c1:4:tool","event_id":4,"time":"` + now + `","phase":"use","tool_use_id":"t1","name":"Bash","input":{"command":"ls"}}`,
		contract.PathReportUsage:      `{"idempotency_key":"c1:9:usage","event_id":9,"time":"` + now + `","client_message_id":"m1","outcome":"completed","usage":{"input_tokens":1,"output_tokens":2,"cache_creation_input_tokens":0,"cache_read_input_tokens":0},"cost_nano_usd":3,"num_turns":1,"duration_ms":5}`,
		contract.PathReportActivity:   `{"idempotency_key":"c1:1:activity","event_id":1,"time":"` + now + `","type":"turn_started","summary":"turn m1 started"}`,
	}
	for path, body := range bodies {
		for i, wantDup := range []bool{false, true} {
			st, b := s.do(t, tok, "POST", path, body)
			var ack contract.ReportAck
			if st != 200 || json.Unmarshal(b, &ack) != nil || ack.Duplicate != wantDup {
				t.Errorf("%s try %d: %d %s, want 200 with duplicate %v", path, i, st, b, wantDup)
			}
		}
	}
	// Invalid bodies are 400 and store nothing.
	for path, body := range map[string]string{
		contract.PathReportToolEvents: `{"idempotency_key":"c1:5:tool","event_id":5,"time":"` + now + `","phase":"maybe","tool_use_id":"t1"}`,
		contract.PathReportUsage:      `{"idempotency_key":"c1:10:usage","event_id":0,"time":"` + now + `","outcome":"completed"}`,
		contract.PathReportActivity:   `{"idempotency_key":"bad key","event_id":2,"time":"` + now + `","type":"x","summary":""}`,
		contract.PathReportIssues:     `{"idempotency_key":"k","title":"two\nlines"}`,
	} {
		if st, b := s.do(t, tok, "POST", path, body); st != http.StatusBadRequest {
			t.Errorf("%s %s: %d %s, want 400", path, body, st, b)
		}
	}
	act, _ := s.store.Activity(t.Context(), "c1", 0, 0)
	if len(act.Activity) != 1 || len(act.ToolCalls) != 1 || len(act.Turns) != 1 {
		t.Errorf("stored: %+v", act)
	}
	// The same key with another body is a conflict, not a silent success.
	if st, b := s.do(t, tok, "POST", contract.PathReportActivity, `{"idempotency_key":"c1:1:activity","event_id":1,"time":"`+now+`","type":"turn_started","summary":"other"}`); st != http.StatusConflict {
		t.Errorf("key reuse: %d %s, want 409", st, b)
	}
	// Issues: create, read, update, comment, list.
	st, b := s.do(t, tok, "POST", contract.PathReportIssues, `{"idempotency_key":"i1","title":"  flaky test  ","body":"it fails"}`)
	var ack contract.IssueAck
	if st != 200 || json.Unmarshal(b, &ack) != nil || ack.Issue.Number != 1 || ack.Issue.Title != "flaky test" || ack.Issue.ConversationID != "c1" {
		t.Fatalf("create: %d %s", st, b)
	}
	if st, b := s.do(t, tok, "POST", "/api/internal/worker/issues/1/comments", `{"idempotency_key":"i2","body":"seen again"}`); st != 200 {
		t.Errorf("comment: %d %s", st, b)
	}
	if st, b := s.do(t, tok, "POST", "/api/internal/worker/issues/1/update", `{"idempotency_key":"i3","state":"closed"}`); st != 200 || !bytes.Contains(b, []byte(`"state":"closed"`)) {
		t.Errorf("update: %d %s", st, b)
	}
	if st, b := s.do(t, tok, "GET", "/api/internal/worker/issues/1", ""); st != 200 || !bytes.Contains(b, []byte(`"seen again"`)) {
		t.Errorf("get: %d %s", st, b)
	}
	for _, p := range []string{"/api/internal/worker/issues/0", "/api/internal/worker/issues/2", "/api/internal/worker/issues/x"} {
		if st, _ := s.do(t, tok, "GET", p, ""); st != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, st)
		}
	}
	if st, b := s.do(t, tok, "GET", contract.PathReportIssues+"?state=open", ""); st != 200 || !bytes.Contains(b, []byte(`"issues":[]`)) {
		t.Errorf("open issues: %d %s", st, b)
	}
	if st, _ := s.do(t, tok, "GET", contract.PathReportIssues+"?state=weird", ""); st != http.StatusBadRequest {
		t.Errorf("bad state: %d, want 400", st)
	}
}
