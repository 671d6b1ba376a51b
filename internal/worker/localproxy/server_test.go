package localproxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/worker/localproxy"
)

func TestLocalProxyRequiresConversationCredential(t *testing.T) {
	gw, mint := newFakeServer(t), newMintServer(t)
	s, logs := startProxy(t, newMintingProxy(t, gw, mint))
	secretA, secretB := localproxy.NewPlaceholderSecret(), localproxy.NewPlaceholderSecret()
	if secretA == secretB {
		t.Fatalf("NewPlaceholderSecret: got %q twice, want fresh secrets", secretA)
	}
	s.Register(convA, secretA)
	s.Register(convB, secretB)
	const convC = "conv-c" // never registered

	cases := []struct {
		name string
		conv string
		hdr  http.Header
		want int
	}{
		{"bearer placeholder", convA, bearer(secretA), http.StatusOK},
		{"x-api-key placeholder", convA, http.Header{"X-Api-Key": {secretA}}, http.StatusOK},
		{"no credential", convA, nil, http.StatusUnauthorized},
		{"empty bearer", convA, bearer(""), http.StatusUnauthorized},
		{"wrong secret", convA, bearer(secretA + "x"), http.StatusUnauthorized},
		{"secret prefix", convA, bearer(secretA[:len(secretA)-1]), http.StatusUnauthorized},
		{"other conversation's placeholder", convA, bearer(secretB), http.StatusUnauthorized},
		{"other conversation's placeholder as x-api-key", convA, http.Header{"X-Api-Key": {secretB}}, http.StatusUnauthorized},
		{"unregistered conversation", convC, bearer(secretA), http.StatusUnauthorized},
		{"unregistered conversation without credential", convC, nil, http.StatusUnauthorized},
	}
	wantForwarded := 0
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := send(t, http.MethodPost, s.BaseURL(tc.conv)+"/v1/messages", tc.hdr, messagesBody)
			if tc.want == http.StatusOK {
				if got.status != http.StatusOK {
					t.Fatalf("status: got %d (%s), want 200", got.status, got.body)
				}
				return
			}
			checkEnvelope(t, got, tc.want, anthropic.ErrAuthentication)
		})
		if tc.want == http.StatusOK {
			wantForwarded++
		}
	}
	// Unregister revokes the placeholder.
	s.Unregister(convA)
	checkEnvelope(t, send(t, http.MethodPost, s.BaseURL(convA)+"/v1/messages", bearer(secretA), messagesBody), http.StatusUnauthorized, anthropic.ErrAuthentication)

	if n := len(gw.requests()); n != wantForwarded {
		t.Errorf("gateway requests: got %d, want %d (refused requests must not be forwarded)", n, wantForwarded)
	}
	if n := len(mint.requests()); n != wantForwarded {
		t.Errorf("mint calls: got %d, want %d (refused requests must not spend a mint)", n, wantForwarded)
	}
	if l := logs.String(); strings.Contains(l, secretA) || strings.Contains(l, secretB) || strings.Contains(l, identity) {
		t.Errorf("log contains a credential:\n%s", l)
	}
}

func TestLocalProxyNoOpReplacesCredentials(t *testing.T) {
	up := devupstream.New(devupstream.Config{APIKey: "sk-local"})
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	upURL, err := url.Parse(upSrv.URL)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := startProxy(t, &localproxy.NoOpGatewayProxy{Upstream: upURL, APIKey: "sk-local"})
	secret := localproxy.NewPlaceholderSecret()
	s.Register(convA, secret)

	const beta = "interleaved-thinking-2025-05-14,context-management-2025-06-27"
	hdr := http.Header{
		"Authorization":       {"Bearer " + secret},
		"X-Api-Key":           {secret},
		"Cookie":              {"sid=browser-secret"},
		"Proxy-Authorization": {"Basic eDp5"},
		"X-Worker-Token":      {"forged-by-a-tool"},
		"Anthropic-Version":   {"2023-06-01"},
		"Anthropic-Beta":      {beta},
		"Content-Type":        {"application/json"},
	}
	got := send(t, http.MethodPost, s.BaseURL(convA)+"/v1/messages?beta=true", hdr, messagesBody)
	if got.status != http.StatusOK || !strings.Contains(string(got.body), "event: message_stop") {
		t.Fatalf("got %d %q, want 200 and a complete stream", got.status, got.body)
	}
	recs := up.Requests()
	if len(recs) != 1 {
		t.Fatalf("upstream requests: got %d, want 1", len(recs))
	}
	r := recs[0]
	if r.Path != "/v1/messages" || r.Query != "beta=true" {
		t.Errorf("upstream URL: got %s?%s, want /v1/messages?beta=true", r.Path, r.Query)
	}
	if diff := cmp.Diff([]string{"sk-local"}, r.Header.Values("X-Api-Key")); diff != "" {
		t.Errorf("upstream x-api-key (-want +got):\n%s", diff)
	}
	for _, k := range []string{"Authorization", "Cookie", "Proxy-Authorization", contract.HeaderWorkerToken, "X-Forwarded-For"} {
		if v := r.Header.Values(k); len(v) != 0 {
			t.Errorf("upstream header %s: got %q, want none", k, v)
		}
	}
	if r.Header.Get("Anthropic-Version") != "2023-06-01" || r.Header.Get("Anthropic-Beta") != beta {
		t.Errorf("upstream anthropic headers: got version %q beta %q, want them unchanged", r.Header.Get("Anthropic-Version"), r.Header.Get("Anthropic-Beta"))
	}
	if string(r.Body) != messagesBody {
		t.Errorf("upstream body: got %q, want %q", r.Body, messagesBody)
	}
}

func TestLocalProxyMintsFreshTokenPerRequest(t *testing.T) {
	gw, mint := newFakeServer(t), newMintServer(t)
	s, logs := startProxy(t, newMintingProxy(t, gw, mint))
	secret := localproxy.NewPlaceholderSecret()
	s.Register(convA, secret)
	hdr := http.Header{
		"Authorization":     {"Bearer " + secret},
		"X-Api-Key":         {secret},
		"Cookie":            {"sid=browser-secret"},
		"X-Worker-Token":    {"forged-by-a-tool"},
		"Anthropic-Version": {"2023-06-01"},
		"Anthropic-Beta":    {"oauth-2025-04-20"},
	}
	for i := range 2 {
		got := send(t, http.MethodPost, s.BaseURL(convA)+"/v1/messages?beta=true", hdr, messagesBody)
		if got.status != http.StatusOK || string(got.body) != `{"ok":true}` {
			t.Fatalf("request %d: got %d %q, want the gateway's 200 answer", i, got.status, got.body)
		}
		if want := fmt.Sprintf("req_fake_%d", i+1); got.header.Get("request-id") != want {
			t.Errorf("request %d: request-id got %q, want %q passed through", i, got.header.Get("request-id"), want)
		}
	}
	mints := mint.requests()
	if len(mints) != 2 {
		t.Fatalf("mint calls: got %d, want 2 (one fresh WorkerToken per request)", len(mints))
	}
	for i, m := range mints {
		if m.Method != http.MethodPost || m.Path != contract.PathMint {
			t.Errorf("mint call %d: got %s %s, want POST %s", i, m.Method, m.Path, contract.PathMint)
		}
		if got := m.Header.Values("Authorization"); len(got) != 1 || got[0] != "Bearer "+identity {
			t.Errorf("mint call %d: Authorization got %q, want the identity token as bearer", i, got)
		}
		var mr contract.MintRequest
		if err := json.Unmarshal(m.Body, &mr); err != nil || mr.ConversationID != convA {
			t.Errorf("mint call %d: body %q, want conversation_id %q", i, m.Body, convA)
		}
	}
	reqs := gw.requests()
	if len(reqs) != 2 {
		t.Fatalf("gateway requests: got %d, want 2", len(reqs))
	}
	for i, r := range reqs {
		if want := contract.PathGatewayPrefix + "/v1/messages"; r.Path != want || r.Query != "beta=true" {
			t.Errorf("gateway request %d: got %s?%s, want %s?beta=true", i, r.Path, r.Query, want)
		}
		if diff := cmp.Diff([]string{fmt.Sprintf("wt-%d", i+1)}, r.Header.Values(contract.HeaderWorkerToken)); diff != "" {
			t.Errorf("gateway request %d: X-Worker-Token (-want +got):\n%s", i, diff)
		}
		for _, k := range []string{"Authorization", "X-Api-Key", "Cookie", "Proxy-Authorization"} {
			if v := r.Header.Values(k); len(v) != 0 {
				t.Errorf("gateway request %d: header %s got %q, want none", i, k, v)
			}
		}
		if r.Header.Get("Anthropic-Version") != "2023-06-01" || r.Header.Get("Anthropic-Beta") != "oauth-2025-04-20" {
			t.Errorf("gateway request %d: anthropic headers not forwarded: %v", i, r.Header)
		}
		if string(r.Body) != messagesBody {
			t.Errorf("gateway request %d: body got %q, want %q", i, r.Body, messagesBody)
		}
	}
	if l := logs.String(); strings.Contains(l, "wt-1") || strings.Contains(l, secret) || strings.Contains(l, identity) {
		t.Errorf("log contains a credential:\n%s", l)
	}
}

func TestLocalProxyMintFailures(t *testing.T) {
	mintAnswer := func(status int, body string) func(w http.ResponseWriter, r *http.Request, n int) {
		return func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			io.WriteString(w, body)
		}
	}
	cases := []struct {
		name   string
		answer func(w http.ResponseWriter, r *http.Request, n int) // nil: mint unreachable
		status int
		typ    string
	}{
		{"mint 401", mintAnswer(401, `{"error":{"type":"unauthorized","message":"identity token revoked"}}`), http.StatusForbidden, anthropic.ErrPermission},
		{"mint 403", mintAnswer(403, `{"error":{"type":"forbidden","message":"conversation not in this worker's tenant-env"}}`), http.StatusForbidden, anthropic.ErrPermission},
		{"mint 500", mintAnswer(500, `{"error":{"type":"internal_error","message":"internal error"}}`), http.StatusServiceUnavailable, anthropic.ErrAPI},
		{"mint 502 not JSON", mintAnswer(502, `<html>bad gateway</html>`), http.StatusServiceUnavailable, anthropic.ErrAPI},
		{"mint 200 without token", mintAnswer(200, `{"expires_at":"2026-11-30T12:00:00Z"}`), http.StatusServiceUnavailable, anthropic.ErrAPI},
		{"mint 200 garbage", mintAnswer(200, `not json`), http.StatusServiceUnavailable, anthropic.ErrAPI},
		{"mint unreachable", nil, http.StatusServiceUnavailable, anthropic.ErrAPI},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gw, mint := newFakeServer(t), newFakeServer(t)
			mint.setHandler(tc.answer)
			p := newMintingProxy(t, gw, mint)
			if tc.answer == nil {
				mint.srv.Close() // nothing listens there any more
			}
			s, _ := startProxy(t, p)
			secret := localproxy.NewPlaceholderSecret()
			s.Register(convA, secret)
			got := send(t, http.MethodPost, s.BaseURL(convA)+"/v1/messages", bearer(secret), messagesBody)
			checkEnvelope(t, got, tc.status, tc.typ)
			if strings.Contains(string(got.body), identity) || strings.Contains(string(got.body), secret) {
				t.Errorf("answer contains a credential: %s", got.body)
			}
			if n := len(gw.requests()); n != 0 {
				t.Errorf("gateway requests: got %d, want none", n)
			}
		})
	}
}

func TestLocalProxyHelloNeedsNoMint(t *testing.T) {
	gw, mint := newFakeServer(t), newMintServer(t)
	s, _ := startProxy(t, newMintingProxy(t, gw, mint))
	s.Register(convA, localproxy.NewPlaceholderSecret())
	for _, m := range []string{http.MethodHead, http.MethodGet} {
		if got := send(t, m, s.BaseURL(convA)+"/api/hello", nil, ""); got.status != http.StatusOK {
			t.Errorf("%s /api/hello: got %d, want 200", m, got.status)
		}
	}
	if n := len(mint.requests()); n != 0 {
		t.Errorf("mint calls: got %d, want none", n)
	}
	if n := len(gw.requests()); n != 0 {
		t.Errorf("gateway requests: got %d, want none", n)
	}
}

func TestLocalProxyRejectsInvalidConversationPath(t *testing.T) {
	gw, mint := newFakeServer(t), newMintServer(t)
	s, _ := startProxy(t, newMintingProxy(t, gw, mint))
	secret := localproxy.NewPlaceholderSecret()
	s.Register(convA, secret)
	base := strings.TrimSuffix(s.BaseURL(convA), "/"+convA)
	for _, p := range []string{
		"/",
		"/" + convA,
		"/-leading-dash/v1/messages",
		"/_leading-underscore/v1/messages",
		"/conv.dot/v1/messages",
		"/conv%20space/v1/messages",
		"/%2e%2e/v1/messages",
		"/" + strings.Repeat("a", 65) + "/v1/messages",
	} {
		t.Run(p, func(t *testing.T) {
			checkEnvelope(t, send(t, http.MethodPost, base+p, bearer(secret), messagesBody), http.StatusNotFound, anthropic.ErrNotFound)
		})
	}
	if n := len(mint.requests()); n != 0 {
		t.Errorf("mint calls: got %d, want none", n)
	}
	if n := len(gw.requests()); n != 0 {
		t.Errorf("gateway requests: got %d, want none", n)
	}
}

// TestLocalProxyKeepsRequestsUnderGatewayPrefix guards against a dot-segment
// path escaping the gateway prefix: a tool process holding the placeholder
// (it inherits the CLI's environment) must not be able to send a freshly
// minted WorkerToken to another control-plane endpoint.
func TestLocalProxyKeepsRequestsUnderGatewayPrefix(t *testing.T) {
	gw, mint := newFakeServer(t), newMintServer(t)
	s, _ := startProxy(t, newMintingProxy(t, gw, mint))
	secret := localproxy.NewPlaceholderSecret()
	s.Register(convA, secret)
	for _, p := range []string{
		"/../../../../api/internal/worker/usage",
		"/v1/../../../../../api/internal/worker/issues",
		"/%2e%2e/%2e%2e/%2e%2e/%2e%2e/api/internal/worker/usage",
		"/..%2f..%2f..%2f..%2fapi/internal/worker/usage",
	} {
		t.Run(p, func(t *testing.T) {
			before := len(gw.requests())
			got := send(t, http.MethodPost, s.BaseURL(convA)+p, bearer(secret), messagesBody)
			reqs := gw.requests()
			for _, r := range reqs[before:] {
				if !strings.HasPrefix(r.Path, contract.PathGatewayPrefix+"/") {
					t.Errorf("request to %s reached the control plane at %q with X-Worker-Token %q; want it refused (404) or kept under %s/",
						p, r.Path, r.Header.Get(contract.HeaderWorkerToken), contract.PathGatewayPrefix)
				}
			}
			if len(reqs) == before && got.status != http.StatusNotFound {
				t.Errorf("status: got %d, want 404 when refused", got.status)
			}
		})
	}
}

// TestLocalProxyStreamsEventByEvent proves the proxy does not buffer: the
// target writes the next event only after the client has read the previous
// one, so any buffering deadlocks (and fails on the target's timeout).
func TestLocalProxyStreamsEventByEvent(t *testing.T) {
	target := newFakeServer(t)
	acks := make(chan struct{})
	failures := make(chan string, 4)
	const events = 4
	target.setHandler(func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for i := 1; i <= events; i++ {
			fmt.Fprintf(w, "event: e%d\ndata: {\"n\":%d}\n\n", i, i)
			if err := rc.Flush(); err != nil {
				failures <- fmt.Sprintf("flush event %d: %v", i, err)
				return
			}
			if i == events {
				return
			}
			select {
			case <-acks:
			case <-time.After(1500 * time.Millisecond):
				failures <- fmt.Sprintf("event %d not read by the client within 1.5 s: the proxy buffers", i)
				return
			case <-r.Context().Done():
				return
			}
		}
	})
	s, _ := startProxy(t, &localproxy.NoOpGatewayProxy{Upstream: target.URL, APIKey: "sk-local"})
	secret := localproxy.NewPlaceholderSecret()
	s.Register(convA, secret)

	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.BaseURL(convA)+"/v1/messages", strings.NewReader(messagesBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type: got %q, want text/event-stream", ct)
	}
	br := bufio.NewReader(resp.Body)
	var got strings.Builder
	for i := 1; i <= events; i++ {
		var ev strings.Builder
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("read event %d: %v (target: %v)", i, err, drain(failures))
			}
			ev.WriteString(line)
			if line == "\n" {
				break
			}
		}
		if want := fmt.Sprintf("event: e%d\ndata: {\"n\":%d}\n\n", i, i); ev.String() != want {
			t.Errorf("event %d: got %q, want %q", i, ev.String(), want)
		}
		got.WriteString(ev.String())
		if i < events {
			acks <- struct{}{}
		}
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Errorf("after the last event: got %q, %v; want a clean end", rest, err)
	}
	if f := drain(failures); f != nil {
		t.Errorf("target: %v", f)
	}
}

func drain(ch chan string) []string {
	var out []string
	for {
		select {
		case s := <-ch:
			out = append(out, s)
		default:
			return out
		}
	}
}

func TestLocalProxyGatewayUnreachableIs502(t *testing.T) {
	gw, mint := newFakeServer(t), newMintServer(t)
	gw.srv.Close()
	s, _ := startProxy(t, newMintingProxy(t, gw, mint))
	secret := localproxy.NewPlaceholderSecret()
	s.Register(convA, secret)
	got := send(t, http.MethodPost, s.BaseURL(convA)+"/v1/messages", bearer(secret), messagesBody)
	checkEnvelope(t, got, http.StatusBadGateway, anthropic.ErrAPI)
	if strings.Contains(string(got.body), "wt-1") {
		t.Errorf("answer contains the minted token: %s", got.body)
	}
}

// TestLocalProxyRetriesExpiredToken: the gateway answers an expired
// WorkerToken with 401 and x-should-retry: false (true for a client that
// resends its token); behind the local proxy the retried request carries a
// freshly minted token, so the CLI is told to retry. Any other 401 passes
// through as it came, body and all.
func TestLocalProxyRetriesExpiredToken(t *testing.T) {
	for _, tc := range []struct {
		name, code, wantRetry string
	}{
		{"expired token", contract.ErrCodeTokenExpired, "true"},
		{"other 401", "", "false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var details map[string]any
			if tc.code != "" {
				details = map[string]any{"error_code": tc.code}
			}
			gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("x-should-retry", "false")
				httpapi.AnthropicBody(w, r, &httpapi.Error{Status: http.StatusUnauthorized, Type: anthropic.ErrAuthentication, Msg: "refused", Details: details})
			}))
			t.Cleanup(gw.Close)
			gwURL, _ := url.Parse(gw.URL)
			s, _ := startProxy(t, &localproxy.NoOpGatewayProxy{Upstream: gwURL})
			secret := localproxy.NewPlaceholderSecret()
			s.Register(convA, secret)
			got := send(t, http.MethodPost, s.BaseURL(convA)+"/v1/messages", http.Header{"X-Api-Key": {secret}, "Content-Type": {"application/json"}}, messagesBody)
			if got.status != http.StatusUnauthorized || got.header.Get("x-should-retry") != tc.wantRetry {
				t.Errorf("got %d x-should-retry %q, want 401 %q", got.status, got.header.Get("x-should-retry"), tc.wantRetry)
			}
			var env anthropic.ErrorEnvelope
			if err := json.Unmarshal(got.body, &env); err != nil || env.Error.Message != "refused" {
				t.Errorf("body: got %q (%v), want the gateway's envelope unchanged", got.body, err)
			}
		})
	}
}

// TestServeConversation: the listener inside one agent's network namespace
// serves that conversation only, and holds at most a few connections open
// (an agent opening thousands cannot spend the worker's descriptors).
func TestServeConversation(t *testing.T) {
	s := localproxy.NewServer(&localproxy.NoOpGatewayProxy{Upstream: &url.URL{Scheme: "http", Host: "127.0.0.1:9"}, APIKey: "k"}, slog.New(slog.DiscardHandler))
	s.Register(convA, "secret-a")
	s.Register(convB, "secret-b")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.ServeConversation(ctx, ln, convA)
	base := "http://" + ln.Addr().String()
	// Another conversation's path, with that conversation's own secret.
	req, _ := http.NewRequest("POST", base+"/"+convB+"/v1/messages", strings.NewReader(`{}`))
	req.Header.Set("X-Api-Key", "secret-b")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("another conversation through this listener: %d, want 404", resp.StatusCode)
	}
	// Idle connections beyond the cap are closed (answered 503 when the
	// request comes): the server holds at most 16.
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 40 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	var refusedN atomic.Int64
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(time.Now().Add(4 * time.Second))
			b := make([]byte, 12)
			n, err := io.ReadFull(c, b)
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || n == 12 && string(b) == "HTTP/1.1 503" {
				refusedN.Add(1)
			}
		}()
	}
	wg.Wait()
	refused := int(refusedN.Load())
	if refused < 40-16 {
		t.Errorf("%d of 40 idle connections refused, want at least %d", refused, 40-16)
	}
}
