// Package gateway is the control plane's gateway-proxy
// (/api/internal/gateway/anthropic/*): the one place that holds the Anthropic
// API key and the one place that spends money.
//
// For each call it validates the WorkerToken, resolves tenant, env,
// conversation and user from it, reserves the call's worst-case cost with the
// UserBudgetService (preCallCheck; a denial is a 429 that Anthropic clients do
// not retry), strips every client credential, adds the API key, forwards the
// request and streams the answer back byte for byte, flushed per write, while
// a tee reads the usage; when the answer ends it books the actual cost
// (postCallDebit). Errors use Anthropic's error envelope.
//
// Main type: Handler. It does not mint tokens (package mint) or store prices
// (package budget).
package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/budget"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/token"
)

// Budget is the UserBudgetService as the gateway uses it.
type Budget interface {
	PreCallCheck(ctx context.Context, userID string, estimated budget.NanoUSD) (budget.Reservation, error)
	PostCallDebit(ctx context.Context, res budget.Reservation, actual budget.NanoUSD, d budget.Debit) error
}

var _ Budget = (*budget.Service)(nil)

// Config configures a Handler.
type Config struct {
	// Upstream is the Anthropic-compatible base URL, e.g.
	// https://api.anthropic.com. Required.
	Upstream *url.URL
	// APIKey is sent upstream as x-api-key. Empty sends none (a development
	// upstream that needs no key).
	APIKey string
	// Keys verify WorkerTokens (derived from the master key). Required.
	Keys []token.Key
	// Budget is the UserBudgetService. Required.
	Budget Budget
	// Prices price calls; nil means budget.DefaultPrices().
	Prices budget.PriceTable
	// Transport reaches the upstream; nil means a tuned http.Transport.
	Transport http.RoundTripper
	Logger    *slog.Logger
}

// MaxRequestBytes is the largest request body forwarded (Anthropic's own
// Messages limit, 32 MB).
const MaxRequestBytes = 32 << 20

// MaxOutputTokens bounds max_tokens of a call the gateway admits (16 Mi
// tokens: far above any model's output limit).
const MaxOutputTokens = 1 << 24

// allowedPaths are the upstream API paths workers may call.
var allowedPaths = map[string]bool{
	"/v1/messages":              true,
	"/v1/messages/count_tokens": true,
}

// Handler is the gateway-proxy.
type Handler struct {
	cfg      Config
	verifier *token.Verifier
	rp       *httputil.ReverseProxy
	log      *slog.Logger
}

// New returns the gateway-proxy.
func New(cfg Config) *Handler {
	if cfg.Prices == nil {
		cfg.Prices = budget.DefaultPrices()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Transport == nil {
		cfg.Transport = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          512,
			MaxIdleConnsPerHost:   256,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ResponseHeaderTimeout: 10 * time.Minute,
			ForceAttemptHTTP2:     true,
		}
	}
	h := &Handler{cfg: cfg, verifier: token.NewVerifier(token.PurposeGateway, cfg.Keys...), log: cfg.Logger}
	h.rp = &httputil.ReverseProxy{
		Rewrite:        h.rewrite,
		Transport:      cfg.Transport,
		FlushInterval:  -1, // flush every write: each SSE event reaches the worker at once
		ModifyResponse: h.modifyResponse,
		ErrorHandler:   h.proxyError,
	}
	return h
}

type call struct {
	claims    *token.Claims
	apiPath   string
	res       budget.Reservation
	reserved  bool
	requestID string
	start     time.Time
}

type ctxKey struct{}

func gatewayRequestID() string { return "req_gw_" + token.NewID()[:20] }

// ServeHTTP handles one call.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reqID := gatewayRequestID()
	fail := func(status int, typ, msg string, hdr map[string]string, details map[string]any) {
		h.log.Info("gateway refused call", "status", status, "type", typ, "msg", msg, "path", r.URL.Path, "request_id", reqID)
		for k, v := range hdr {
			w.Header().Set(k, v)
		}
		anthropic.WriteError(w, status, typ, msg, reqID, details)
	}
	apiPath := strings.TrimPrefix(r.URL.Path, contract.PathGatewayPrefix)
	if !allowedPaths[apiPath] {
		fail(http.StatusNotFound, anthropic.ErrNotFound, "the gateway forwards only /v1/messages and /v1/messages/count_tokens", nil, nil)
		return
	}
	if r.Method != http.MethodPost {
		fail(http.StatusMethodNotAllowed, anthropic.ErrInvalidRequest, "method not allowed", nil, nil)
		return
	}
	raw := r.Header.Get(contract.HeaderWorkerToken)
	if raw == "" {
		fail(http.StatusUnauthorized, anthropic.ErrAuthentication, "missing X-Worker-Token", nil, nil)
		return
	}
	claims, err := h.verifier.Verify(raw)
	if err != nil {
		h.log.Warn("gateway refused worker token", "token", token.Fingerprint(raw), "request_id", reqID, "err", err)
		fail(http.StatusUnauthorized, anthropic.ErrAuthentication, "invalid or expired worker token", nil, nil)
		return
	}
	if claims.Conversation == "" || claims.User == "" {
		fail(http.StatusForbidden, anthropic.ErrPermission, "worker token not scoped to a conversation", nil, nil)
		return
	}
	if r.ContentLength > MaxRequestBytes {
		fail(http.StatusRequestEntityTooLarge, anthropic.ErrTooLarge, "request body over 32 MB", nil, nil)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			fail(http.StatusRequestEntityTooLarge, anthropic.ErrTooLarge, "request body over 32 MB", nil, nil)
			return
		}
		if r.Context().Err() != nil {
			return
		}
		fail(http.StatusBadRequest, anthropic.ErrInvalidRequest, "read request body: "+err.Error(), nil, nil)
		return
	}
	c := &call{claims: claims, apiPath: apiPath, requestID: reqID, start: time.Now()}
	log := h.log.With("tenant", claims.Tenant, "env", claims.Env, "conversation", claims.Conversation, "user", claims.User, "request_id", reqID)
	if apiPath == "/v1/messages" {
		var head struct {
			Model     string `json:"model"`
			MaxTokens int64  `json:"max_tokens"`
		}
		if err := json.Unmarshal(body, &head); err != nil {
			fail(http.StatusBadRequest, anthropic.ErrInvalidRequest, "request body is not a JSON object", nil, nil)
			return
		}
		if head.MaxTokens < 1 || head.MaxTokens > MaxOutputTokens {
			fail(http.StatusBadRequest, anthropic.ErrInvalidRequest, fmt.Sprintf("max_tokens must be between 1 and %d", MaxOutputTokens), nil, nil)
			return
		}
		price, _ := h.cfg.Prices.PriceFor(head.Model)
		// Input tokens, over-estimated: no tokenizer yields fewer than one
		// token per 3 bytes of JSON.
		est := price.WorstCase(int64(len(body))/3+1, max(head.MaxTokens, 1))
		res, err := h.cfg.Budget.PreCallCheck(r.Context(), claims.User, est)
		var deny *budget.DenyError
		if errors.As(err, &deny) {
			log.Info("budget denied call", "limit_nano_usd", deny.Limit, "committed_nano_usd", deny.Committed, "needed_nano_usd", deny.Needed)
			fail(http.StatusTooManyRequests, anthropic.ErrRateLimit,
				"TalkIDE budget exhausted: your spending limit for "+deny.Period+" does not cover this call. Ask your administrator to raise it.",
				map[string]string{"x-should-retry": "false"}, map[string]any{"error_code": "budget_exceeded"})
			return
		}
		if err != nil {
			log.Error("budget check failed", "err", err)
			fail(http.StatusServiceUnavailable, anthropic.ErrAPI, "budget service unavailable", nil, nil)
			return
		}
		c.res, c.reserved = res, true
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, c))
	h.rp.ServeHTTP(w, r)
}

// credentialHeaders never leave the gateway towards the upstream.
var credentialHeaders = []string{"Authorization", "X-Api-Key", "Cookie", "Proxy-Authorization", contract.HeaderWorkerToken}

func (h *Handler) rewrite(pr *httputil.ProxyRequest) {
	c := pr.In.Context().Value(ctxKey{}).(*call)
	pr.Out.URL = httpapi.JoinURL(h.cfg.Upstream, c.apiPath)
	pr.Out.URL.RawQuery = pr.In.URL.RawQuery
	pr.Out.Host = pr.Out.URL.Host
	for _, k := range credentialHeaders {
		pr.Out.Header.Del(k)
	}
	if h.cfg.APIKey != "" {
		pr.Out.Header.Set("X-Api-Key", h.cfg.APIKey)
	}
	// Ask for an uncompressed answer so the tee can read usage without
	// decoding; the bytes reach the worker exactly as the upstream sent them.
	pr.Out.Header.Set("Accept-Encoding", "identity")
}

func (h *Handler) modifyResponse(resp *http.Response) error {
	c := resp.Request.Context().Value(ctxKey{}).(*call)
	resp.Header.Set("X-Accel-Buffering", "no")
	if !c.reserved {
		return nil
	}
	m := &meteredBody{rc: resp.Body, done: func(u anthropic.Usage, complete bool) { h.settle(c, resp, u, complete) }}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		m.stream = &anthropic.StreamMeter{}
	}
	resp.Body = m
	return nil
}

// settle books the call: the cost of the usage seen, the reservation released.
func (h *Handler) settle(c *call, resp *http.Response, u anthropic.Usage, complete bool) {
	price, known := h.cfg.Prices.PriceFor(u.Model)
	cost := budget.NanoUSD(0)
	if u.Started {
		cost = price.Cost(u)
	}
	reqID := resp.Header.Get("request-id")
	if reqID == "" {
		reqID = c.requestID
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := h.cfg.Budget.PostCallDebit(ctx, c.res, cost, budget.Debit{ConversationID: c.claims.Conversation, RequestID: reqID, Usage: u})
	log := h.log.With("tenant", c.claims.Tenant, "env", c.claims.Env, "conversation", c.claims.Conversation, "user", c.claims.User, "request_id", reqID)
	if err != nil {
		log.Error("post-call debit failed", "cost_nano_usd", cost, "err", err)
		return
	}
	log.Info("call settled", "status", resp.StatusCode, "model", u.Model, "known_model", known, "input_tokens", u.InputTokens,
		"output_tokens", u.OutputTokens, "cache_write_tokens", u.CacheCreationInputTokens, "cache_read_tokens", u.CacheReadInputTokens,
		"cost_nano_usd", cost, "complete", complete, "duration_ms", time.Since(c.start).Milliseconds())
}

func (h *Handler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	c, _ := r.Context().Value(ctxKey{}).(*call)
	if c != nil && c.reserved {
		// Nothing reached the upstream model (or nothing came back): release.
		h.settleNothing(c)
	}
	if r.Context().Err() != nil {
		h.log.Info("gateway client went away", "status", httpapi.StatusClientClosed)
		return
	}
	status, typ := http.StatusBadGateway, anthropic.ErrAPI
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		status, typ = http.StatusGatewayTimeout, anthropic.ErrTimeout
	}
	reqID := ""
	if c != nil {
		reqID = c.requestID
	}
	h.log.Error("gateway upstream failed", "status", status, "request_id", reqID, "err", err)
	anthropic.WriteError(w, status, typ, "upstream unreachable", reqID, nil)
}

func (h *Handler) settleNothing(c *call) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.cfg.Budget.PostCallDebit(ctx, c.res, 0, budget.Debit{ConversationID: c.claims.Conversation, RequestID: c.requestID}); err != nil {
		h.log.Error("release reservation failed", "request_id", c.requestID, "err", err)
	}
}

// maxJSONMeter bounds the copy of a non-streaming answer kept to read its
// usage; Messages answers are far smaller.
const maxJSONMeter = 8 << 20

// meteredBody passes the upstream body through unchanged while reading usage
// from a copy, and reports once when the body ends or is closed.
type meteredBody struct {
	rc     io.ReadCloser
	stream *anthropic.StreamMeter // nil: a JSON answer, kept in buf
	buf    bytes.Buffer
	once   sync.Once
	done   func(u anthropic.Usage, complete bool)
}

func (m *meteredBody) Read(p []byte) (int, error) {
	n, err := m.rc.Read(p)
	if n > 0 {
		if m.stream != nil {
			m.stream.Write(p[:n])
		} else if m.buf.Len()+n <= maxJSONMeter {
			m.buf.Write(p[:n])
		}
	}
	if err == io.EOF {
		m.finish(true)
	}
	return n, err
}

func (m *meteredBody) Close() error {
	err := m.rc.Close()
	m.finish(false)
	return err
}

func (m *meteredBody) finish(eof bool) {
	m.once.Do(func() {
		var u anthropic.Usage
		if m.stream != nil {
			u = m.stream.Usage()
		} else if pu, ok := anthropic.ParseMessageUsage(m.buf.Bytes()); ok {
			u = pu
		}
		m.done(u, eof && (m.stream == nil || u.Finished))
	})
}
