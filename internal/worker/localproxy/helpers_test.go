package localproxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/platformtest"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker/localproxy"
)

const (
	convA = "conv-a"
	convB = "conv-b"
)

// testMaster signs the identity tokens of the tests with fake mints.
var testMaster = func() token.MasterKey {
	m, err := token.NewMasterKey("k-test")
	if err != nil {
		panic(err)
	}
	return m
}()

// identity is an identity token of demo/dev, the tenant-env of the tests.
var identity = signIdentity("demo", "dev", time.Hour)

// signIdentity returns an identity token for tenant/env valid for ttl.
func signIdentity(tenant, env string, ttl time.Duration) string {
	tok, err := token.NewSigner(token.PurposeIdentity, testMaster.Derive(token.PurposeIdentity, "", "")).Sign(token.Claims{Tenant: tenant, Env: env}, ttl)
	if err != nil {
		panic(err)
	}
	return tok
}

// fixedIdentity returns the Identity of demo/dev holding tok.
func fixedIdentity(t testing.TB, tok string) *localproxy.Identity {
	t.Helper()
	id, err := localproxy.NewIdentity(localproxy.IdentityConfig{Token: tok, Tenant: "demo", Env: "dev", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// seenRequest is a request as a fake server received it.
type seenRequest struct {
	Method, Path, RawPath, Query string
	Header                       http.Header
	Body                         []byte
}

func record(r *http.Request) seenRequest {
	b, _ := io.ReadAll(r.Body)
	return seenRequest{Method: r.Method, Path: r.URL.Path, RawPath: r.URL.RawPath, Query: r.URL.RawQuery, Header: r.Header.Clone(), Body: b}
}

// fakeServer records requests and answers them with handle (by default
// 200 with a small JSON body).
type fakeServer struct {
	srv *httptest.Server
	URL *url.URL

	mu     sync.Mutex
	seen   []seenRequest                                       // guarded by mu
	handle func(w http.ResponseWriter, r *http.Request, n int) // n: 1-based call number; guarded by mu
}

func newFakeServer(t *testing.T) *fakeServer {
	t.Helper()
	fs := &fakeServer{}
	fs.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := record(r)
		fs.mu.Lock()
		fs.seen = append(fs.seen, rec)
		n, h := len(fs.seen), fs.handle
		fs.mu.Unlock()
		// The body was consumed by record; hand the handler a fresh copy.
		r.Body = io.NopCloser(bytes.NewReader(rec.Body))
		if h == nil {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("request-id", fmt.Sprintf("req_fake_%d", n))
			io.WriteString(w, `{"ok":true}`)
			return
		}
		h(w, r, n)
	}))
	t.Cleanup(fs.srv.Close)
	u, err := url.Parse(fs.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	fs.URL = u
	return fs
}

func (fs *fakeServer) setHandler(h func(w http.ResponseWriter, r *http.Request, n int)) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.handle = h
}

func (fs *fakeServer) requests() []seenRequest {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return append([]seenRequest(nil), fs.seen...)
}

// newMintServer is a fake mint endpoint answering call n with WorkerToken
// "wt-<n>".
func newMintServer(t *testing.T) *fakeServer {
	fs := newFakeServer(t)
	fs.setHandler(func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(contract.MintResponse{Token: fmt.Sprintf("wt-%d", n), ExpiresAt: time.Now().Add(2 * time.Minute).UTC()})
	})
	return fs
}

// startProxy runs a LocalGatewayProxyServer through p on loopback until the
// test ends and returns it with its log.
func startProxy(t *testing.T, p localproxy.GatewayProxy) (*localproxy.Server, *platformtest.LogBuffer) {
	t.Helper()
	logs := &platformtest.LogBuffer{}
	s := localproxy.NewServer(p, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if got := s.BaseURL(convA); got != "" {
		t.Errorf("BaseURL before Listen: got %q, want empty", got)
	}
	ln, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: got %v, want nil after shutdown", err)
		}
	})
	if got := s.BaseURL(convA); !strings.HasPrefix(got, "http://127.0.0.1:") || !strings.HasSuffix(got, "/"+convA) {
		t.Errorf("BaseURL: got %q, want http://127.0.0.1:<port>/%s", got, convA)
	}
	return s, logs
}

func newMintingProxy(t testing.TB, gw, mint *fakeServer) *localproxy.MintingGatewayProxy {
	return &localproxy.MintingGatewayProxy{
		Gateway: gw.URL,
		Mint:    &localproxy.MintClient{Base: mint.URL, Identity: fixedIdentity(t, identity)},
	}
}

type result struct {
	status int
	header http.Header
	body   []byte
}

// send makes a request to the local proxy at base+path with headers hdr.
func send(t testing.TB, method, rawURL string, hdr http.Header, body string) result {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, rawURL, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, rawURL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return result{status: resp.StatusCode, header: resp.Header, body: b}
}

// checkEnvelope asserts status and Anthropic's error envelope with typ.
func checkEnvelope(t testing.TB, r result, status int, typ string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status: got %d (%s), want %d", r.status, r.body, status)
	}
	var env anthropic.ErrorEnvelope
	if err := json.Unmarshal(r.body, &env); err != nil {
		t.Fatalf("body %q: got %v, want Anthropic's error envelope", r.body, err)
	}
	if env.Type != "error" || env.Error.Type != typ || env.Error.Message == "" {
		t.Errorf("envelope: got %+v, want type \"error\", error.type %q and a message", env, typ)
	}
	// The proxy's own answers name the model call's request id, which
	// its log lines carry: in the header, the body and the message (all
	// that Claude Code shows).
	if id := env.RequestID; id == "" || r.header.Get("request-id") != id || !strings.HasSuffix(env.Error.Message, " (request "+id+")") {
		t.Errorf("request id: got %q in body, %q in header, message %q; want one id in all three", id, r.header.Get("request-id"), env.Error.Message)
	}
}

func bearer(secret string) http.Header {
	return http.Header{"Authorization": {"Bearer " + secret}}
}

const messagesBody = `{"model":"claude-sonnet-4-5-20250929","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
