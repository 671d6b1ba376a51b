package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/pgtest"
	"github.com/talkide/talkide/internal/sse"
	"github.com/talkide/talkide/internal/token"
)

const (
	testAdminToken = "admin-token-0123456789abcdef"
	testUserToken  = "tk_test_user_token"
	testModel      = "claude-sonnet-4-5"
)

// heldUpstream is an Anthropic-compatible upstream whose streamed answers
// stop after the first content delta until release is closed, then end
// with the message's real usage (100 input tokens, 42 output tokens).
type heldUpstream struct {
	release chan struct{}
	// cut counts calls whose client (the gateway) went away mid-answer.
	cut atomic.Int32
}

func (u *heldUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	if r.URL.Path != "/v1/messages" {
		w.WriteHeader(http.StatusNotFound) // the readiness probe, say
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\""+testModel+"\",\"usage\":{\"input_tokens\":100,\"output_tokens\":1}}}\n\n")
	io.WriteString(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"first \"}}\n\n")
	w.(http.Flusher).Flush()
	select {
	case <-u.release:
	case <-r.Context().Done():
		u.cut.Add(1)
		return
	}
	io.WriteString(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"second\"}}\n\n")
	io.WriteString(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":42}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
}

// TestSIGTERMCutsNoCall guards the redeploy cut of issue 10 item 8: the
// control plane's request contexts derived from the signal context, so
// SIGTERM cut every gateway stream in flight (booked as client_disconnect,
// the agent's turn broken) and the shutdown grace protected nothing.
//
// Two control-plane processes share a PostgreSQL database, as replicas do.
// While a streamed model call and a browser stream are open on the first,
// it gets SIGTERM: it must stop accepting at once, end the browser stream
// cleanly (the browser resumes on the second replica from its last event,
// with no gap and no repeat), let the model call run to its end, book it
// with the usage the upstream reported, and exit 0.
func TestSIGTERMCutsNoCall(t *testing.T) {
	dbURL := pgtest.SchemaURL(t)
	master, err := token.NewMasterKey("k1")
	if err != nil {
		t.Fatal(err)
	}
	up := &heldUpstream{release: make(chan struct{})}
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	worker := newFakeWorker()
	wSrv := httptest.NewServer(worker)
	t.Cleanup(wSrv.Close)
	env := []string{
		"TALKIDE_MASTER_KEYS=" + master.String(), "TALKIDE_DATABASE_URL=" + dbURL,
		"TALKIDE_UPSTREAM_URL=" + upSrv.URL, "ANTHROPIC_API_KEY=sk-test",
		"TALKIDE_WORKER_URL_TEMPLATE=" + wSrv.URL, "TALKIDE_ADMIN_TOKEN=" + testAdminToken,
		"TALKIDE_DEV_USER_TOKEN=" + testUserToken, "TALKIDE_DEV_GRANTS=demo/dev",
		// Far longer than the test needs: the call must end on its own,
		// not at the end of the grace period.
		"TALKIDE_SHUTDOWN_GRACE=10m",
	}
	a := startControlPlaneProcess(t, env, "")
	b := startControlPlaneProcess(t, env, "")
	a.waitReady(t)
	b.waitReady(t)

	// A conversation with three events so far, followed by a browser on A.
	st, body := browserDo(t, a.URL, "POST", "/api/conversations", `{"tenant":"demo","env":"dev"}`)
	if st != http.StatusCreated {
		t.Fatalf("create conversation: %d %s", st, body)
	}
	var conv struct{ ID string }
	json.Unmarshal(body, &conv)
	for range 3 {
		worker.add(conv.ID)
	}
	ctx := t.Context()
	stream := func(base string, after int64) *sse.Reader {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/api/conversations/"+conv.ID+"/stream", nil)
		req.Header.Set("Authorization", "Bearer "+testUserToken)
		req.Header.Set(contract.HeaderLastEventID, strconv.FormatInt(after, 10))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("stream from %s: %d %s", base, resp.StatusCode, b)
		}
		return sse.NewReader(resp.Body)
	}
	var seen []int64
	browser := stream(a.URL, 0)
	for len(seen) < 3 {
		ev, err := readEvent(browser)
		if err != nil {
			t.Fatalf("browser stream on A: %v", err)
		}
		seen = append(seen, ev.ID)
	}

	// A streamed model call through A's gateway, held by the upstream
	// after its first delta.
	wt, err := token.NewSigner(token.PurposeGateway, master.Derive(token.PurposeGateway, "", "")).
		Sign(token.Claims{Tenant: "demo", Env: "dev", Conversation: conv.ID, User: "dev"}, token.WorkerTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", a.URL+contract.PathGatewayPrefix+"/v1/messages",
		strings.NewReader(`{"model":"`+testModel+`","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set(contract.HeaderWorkerToken, wt)
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("model call: %d %s", resp.StatusCode, b)
	}
	call := sse.NewReader(resp.Body)
	if e, err := call.Next(); err != nil || e.Type != "message_start" {
		t.Fatalf("model call: first event %q, %v", e.Type, err)
	}

	// The redeploy.
	if err := a.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	worker.add(conv.ID) // may or may not reach the browser through A
	for {
		ev, err := readEvent(browser)
		if errors.Is(err, io.EOF) {
			break // ended cleanly: the browser reconnects
		}
		if err != nil {
			t.Fatalf("browser stream on A after SIGTERM: got %v, want a clean end", err)
		}
		seen = append(seen, ev.ID)
	}
	// A stopped accepting before it ended the streams.
	if c, err := net.Dial("tcp", strings.TrimPrefix(a.URL, "http://")); err == nil {
		c.Close()
		t.Errorf("A still accepts connections after SIGTERM")
	}
	worker.add(conv.ID)

	// The browser resumes on B from its last event.
	last := seen[len(seen)-1]
	browser = stream(b.URL, last)
	want := worker.add(conv.ID)
	for seen[len(seen)-1] < want {
		ev, err := readEvent(browser)
		if err != nil {
			t.Fatalf("browser stream on B: %v", err)
		}
		seen = append(seen, ev.ID)
	}
	for i, id := range seen {
		if id != int64(i+1) {
			t.Fatalf("browser saw events %v, want 1..%d once each, in order", seen, want)
		}
	}

	// The model call finishes through A, which is still draining.
	close(up.release)
	var types []string
	for {
		e, err := call.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("model call after SIGTERM: %v (events so far %v); the upstream saw %d cut calls", err, types, up.cut.Load())
		}
		types = append(types, e.Type)
	}
	if len(types) == 0 || types[len(types)-1] != "message_stop" {
		t.Fatalf("model call after SIGTERM: got events %v, want them to end with message_stop", types)
	}
	<-a.Exited
	if a.Err != nil {
		t.Errorf("A exited with %v, want 0", a.Err)
	}

	// Booked with its real usage (A books pending debits before it exits).
	st, body = adminGet(t, b.URL, "/api/admin/budget/ledger?kind=debit&conversation="+conv.ID)
	var ledger struct{ Entries []budget.LedgerEntry }
	if err := json.Unmarshal(body, &ledger); st != 200 || err != nil {
		t.Fatalf("ledger: %d %s", st, body)
	}
	if len(ledger.Entries) != 1 || ledger.Entries[0].Outcome != "complete" || ledger.Entries[0].InputTokens != 100 || ledger.Entries[0].OutputTokens != 42 {
		t.Fatalf("ledger after the redeploy: got %s, want one complete debit of 100 input and 42 output tokens", body)
	}
}

func browserDo(t *testing.T, base, method, path, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.WithoutCancel(t.Context()), method, base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testUserToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func adminGet(t *testing.T, base, path string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", base+path, nil)
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}
