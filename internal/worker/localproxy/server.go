package localproxy

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/token"
)

// GatewayProxy decides where a conversation's Anthropic request goes and with
// which credential.
type GatewayProxy interface {
	// Target returns the URL the request with API path apiPath (e.g.
	// "/v1/messages") is sent to and the headers to set on it, for
	// conversation conv. Errors are *httpapi.Error values carrying the
	// Anthropic error the CLI should see (any other error answers 502
	// "gateway unavailable").
	Target(ctx context.Context, conv, apiPath string) (*url.URL, http.Header, error)
}

// credentialHeaders are removed from every request before it leaves the
// worker: the CLI's placeholder and anything resembling a credential.
var credentialHeaders = []string{"Authorization", "X-Api-Key", "Cookie", "Proxy-Authorization", contract.HeaderWorkerToken}

// Server is the LocalGatewayProxyServer.
type Server struct {
	proxy GatewayProxy
	log   *slog.Logger
	rp    *httputil.ReverseProxy
	// errs is the proxy's one error path: a log line and Anthropic's
	// error envelope, which the CLI reads.
	errs httpapi.Translator
	// serve is serveCall behind errs' panic recovery.
	serve http.Handler

	mu sync.Mutex
	// secrets maps a conversation id to the placeholder credential its CLI
	// process was given; guarded by mu.
	secrets map[string]string
	// baseURL is "http://127.0.0.1:<port>" once listening; guarded by mu.
	baseURL string
}

// NewServer returns a Server that forwards through p.
func NewServer(p GatewayProxy, log *slog.Logger) *Server {
	s := &Server{proxy: p, log: httpapi.WithRequestIDs(log), secrets: make(map[string]string)}
	s.errs = httpapi.Translator{Log: s.log, Body: httpapi.AnthropicBody, LogMsg: "local proxy refused call"}
	s.serve = s.errs.Recover(http.HandlerFunc(s.serveCall))
	s.rp = &httputil.ReverseProxy{
		Rewrite:        s.rewrite,
		ModifyResponse: s.answered,
		FlushInterval:  -1, // flush every write: SSE events must not wait in a buffer
		ErrorHandler:   s.proxyError,
		Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ResponseHeaderTimeout: 10 * time.Minute, // the CLI's own timeout is 600 s
			ForceAttemptHTTP2:     true,
		},
	}
	return s
}

// Register allows conversation conv to use the proxy with the placeholder
// credential secret, replacing any earlier one. The harness registers a
// fresh secret for each CLI process it starts.
func (s *Server) Register(conv, secret string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.secrets[conv] = secret
}

// Unregister removes conv's credential.
func (s *Server) Unregister(conv string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.secrets, conv)
}

// BaseURL returns ANTHROPIC_BASE_URL for conversation conv. It is empty until
// Listen returned.
func (s *Server) BaseURL(conv string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.baseURL == "" {
		return ""
	}
	return s.baseURL + "/" + conv
}

// Listen binds 127.0.0.1 on a free port and returns the listener; pass it to
// Serve.
func (s *Server) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen local gateway proxy: %w", err)
	}
	s.mu.Lock()
	s.baseURL = "http://" + ln.Addr().String()
	s.mu.Unlock()
	return ln, nil
}

// Serve serves on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := httpapi.NewServer(ctx, ln.Addr().String(), s, s.log)
	return httpapi.Serve(ctx, srv, ln, 5*time.Second)
}

// ServeConversation serves on ln, a listener of conversation conv's alone
// (inside its agent's network namespace), until ctx ends: requests for any
// other conversation are refused as unknown, and at most
// maxConversationConns connections are open at once (an agent cannot spend
// the worker's descriptors).
func (s *Server) ServeConversation(ctx context.Context, ln net.Listener, conv string) error {
	prefix := "/" + conv + "/"
	only := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, prefix) {
			s.errs.Write(w, r, httpapi.Errorf(http.StatusNotFound, anthropic.ErrNotFound, "unknown path"))
			return
		}
		s.ServeHTTP(w, r)
	})
	ln = httpapi.LimitListener(ln, maxConversationConns, "this conversation has its limit of connections to the local gateway proxy open")
	srv := httpapi.NewServer(ctx, ln.Addr().String(), only, s.log)
	return httpapi.Serve(ctx, srv, ln, 5*time.Second)
}

// maxConversationConns bounds one conversation's open connections to its
// own listener: the CLI uses a few.
const maxConversationConns = 16

type ctxKey struct{}

type target struct {
	url    *url.URL
	header http.Header
}

// ServeHTTP handles /<conversationId>/<api path>. Each model call gets a
// request id (httpapi.NewRequestID), sent to the mint and the gateway in
// X-Request-Id and carried by this proxy's log lines about the call; the
// gateway answers with it (request-id header, error bodies), so the CLI's
// "API Error: …" text, and the turn_failed event made of it, name it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.serve.ServeHTTP(w, r.WithContext(httpapi.WithRequestID(r.Context(), httpapi.NewRequestID())))
}

func (s *Server) serveCall(w http.ResponseWriter, r *http.Request) {
	conv, apiPath, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	apiPath = "/" + apiPath
	if !ok || contract.ValidConversationID(conv) != nil || path.Clean(apiPath) != apiPath {
		// path.Clean: a "/c1/../../api/internal/..." must never leave the
		// gateway prefix with a freshly minted WorkerToken.
		s.errs.Write(w, r, httpapi.Errorf(http.StatusNotFound, anthropic.ErrNotFound, "unknown path"))
		return
	}
	if apiPath == "/api/hello" {
		// The CLI's connectivity pre-flight (off with NONESSENTIAL_TRAFFIC);
		// answer locally instead of spending a mint.
		w.WriteHeader(http.StatusOK)
		return
	}
	if !contract.GatewayForwards(apiPath) {
		s.errs.Write(w, r, httpapi.Errorf(http.StatusNotFound, anthropic.ErrNotFound, "the local gateway proxy forwards only /v1/messages and /v1/messages/count_tokens"))
		return
	}
	if !s.authorized(conv, r) {
		// Another process on loopback guessing: a warning, not info.
		s.log.WarnContext(r.Context(), "local proxy refused a request without the conversation's credential", "conversation", conv, "path", apiPath)
		s.errs.Body(w, r, httpapi.Errorf(http.StatusUnauthorized, anthropic.ErrAuthentication, "missing or wrong conversation credential"))
		return
	}
	u, h, err := s.proxy.Target(r.Context(), conv, apiPath)
	if err != nil {
		var he *httpapi.Error
		if !errors.As(err, &he) {
			he = httpapi.Wrap(http.StatusBadGateway, anthropic.ErrAPI, "gateway unavailable", err)
		}
		s.errs.With("local proxy could not prepare request", "conversation", conv).Write(w, r, he)
		return
	}
	u.RawQuery = r.URL.RawQuery
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, &target{url: u, header: h}))
	s.rp.ServeHTTP(w, r)
}

func (s *Server) authorized(conv string, r *http.Request) bool {
	s.mu.Lock()
	want, ok := s.secrets[conv]
	s.mu.Unlock()
	if !ok || want == "" {
		return false
	}
	got := r.Header.Get("X-Api-Key")
	if b := httpapi.BearerToken(r); b != "" {
		got = b
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func (s *Server) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(ctxKey{}).(*target)
	pr.Out.URL = t.url
	pr.Out.Host = t.url.Host
	for _, h := range credentialHeaders {
		pr.Out.Header.Del(h)
	}
	for k, vs := range t.header {
		pr.Out.Header[k] = vs
	}
	httpapi.SetRequestID(pr.Out)
	// No X-Forwarded-*: the CLI's address is of no use upstream.
}

// answered logs the gateway's answer to a model call (a refusal at info, a
// success at debug), with the call's request id, then lets retryExpired
// look at it.
func (s *Server) answered(resp *http.Response) error {
	level := slog.LevelDebug
	if resp.StatusCode >= 400 {
		level = slog.LevelInfo
	}
	s.log.Log(resp.Request.Context(), level, "model call answered", "path", resp.Request.URL.Path, "status", resp.StatusCode)
	return retryExpired(resp)
}

// maxErrorBody bounds how much of a 401 answer retryExpired reads.
const maxErrorBody = 64 << 10

// retryExpired tells the CLI to retry a 401 that the gateway gave for an
// expired WorkerToken. The gateway says x-should-retry: false, which is
// true for a client that resends the same token; behind this proxy the
// retried request gets a freshly minted one, so here the truth is "retry".
func retryExpired(resp *http.Response) error {
	if resp.StatusCode != http.StatusUnauthorized {
		return nil
	}
	orig := resp.Body
	body, err := io.ReadAll(io.LimitReader(orig, maxErrorBody))
	// The CLI gets the whole answer: what was read, then the rest.
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), orig), orig}
	if err != nil {
		return nil // nothing to decide on; the read error comes again
	}
	var env anthropic.ErrorEnvelope
	if json.Unmarshal(body, &env) == nil && env.Error.Details["error_code"] == contract.ErrCodeTokenExpired {
		resp.Header.Set("x-should-retry", "true")
	}
	return nil
}

func (s *Server) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		s.log.InfoContext(r.Context(), "local proxy client went away", "path", r.URL.Path, "status", httpapi.StatusClientClosed)
		return
	}
	status, typ := http.StatusBadGateway, anthropic.ErrAPI
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		status, typ = http.StatusGatewayTimeout, anthropic.ErrTimeout
	}
	s.errs.With("local proxy upstream failed").Write(w, r, httpapi.Wrap(status, typ, "gateway unreachable", err))
}

// NoOpGatewayProxy forwards straight to an Anthropic-compatible upstream with
// a local API key. Development only: it needs the key inside the worker,
// which production forbids.
type NoOpGatewayProxy struct {
	// Upstream is the upstream base URL, e.g. https://api.anthropic.com.
	Upstream *url.URL
	// APIKey is sent as x-api-key.
	APIKey string
}

var _ GatewayProxy = (*NoOpGatewayProxy)(nil)

// Target returns Upstream + apiPath with x-api-key set.
func (p *NoOpGatewayProxy) Target(_ context.Context, _, apiPath string) (*url.URL, http.Header, error) {
	u := httpapi.JoinURL(p.Upstream, apiPath)
	h := http.Header{}
	if p.APIKey != "" {
		h.Set("X-Api-Key", p.APIKey)
	}
	return u, h, nil
}

// MintingGatewayProxy mints a fresh WorkerToken per request and forwards to
// the control-plane gateway-proxy.
type MintingGatewayProxy struct {
	// Gateway is $TALKIDE_GATEWAY_BASE_URL.
	Gateway *url.URL
	Mint    *MintClient
}

var _ GatewayProxy = (*MintingGatewayProxy)(nil)

// Target mints a WorkerToken for conv and returns the gateway URL for apiPath
// with X-Worker-Token set. Mint failures map to: 401/403 from the mint →
// 403 permission_error (final for the CLI: retrying cannot help); anything
// else → 503 overloaded_error-like api_error (the CLI retries).
func (p *MintingGatewayProxy) Target(ctx context.Context, conv, apiPath string) (*url.URL, http.Header, error) {
	tok, err := p.Mint.Mint(ctx, conv)
	if err != nil {
		var me *MintError
		if errors.As(err, &me) && (me.Status == http.StatusUnauthorized || me.Status == http.StatusForbidden || me.Status == http.StatusNotFound) {
			return nil, nil, httpapi.Wrap(http.StatusForbidden, anthropic.ErrPermission, "worker not allowed to use the gateway for this conversation: "+me.Msg, err)
		}
		return nil, nil, httpapi.Wrap(http.StatusServiceUnavailable, anthropic.ErrAPI, "token mint unavailable", err)
	}
	u := httpapi.JoinURL(p.Gateway, contract.PathGatewayPrefix, apiPath)
	h := http.Header{}
	h.Set(contract.HeaderWorkerToken, tok.Token)
	return u, h, nil
}

// NewPlaceholderSecret returns a random credential for one CLI process.
func NewPlaceholderSecret() string { return "talkide-local-" + token.NewID() }
