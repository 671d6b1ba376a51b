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
// (postCallDebit) in the background, so the client never waits for the
// database. When the budget predicts that it admits the call, the call is
// forwarded while the reservation commits, and the upstream's answer is
// held until the reservation is durable (ticketTransport); a reservation
// refused after all cancels the upstream call, and the client gets the
// refusal. Errors use Anthropic's error envelope. Metrics (metrics.go) and
// the x-talkide-gateway-overhead-ms response header measure what it adds.
//
// Decisions (see also docs/gateway.md):
//   - Compression: the gateway asks the upstream for identity encoding. An
//     upstream that compresses anyway is passed through unchanged (the
//     client decodes it); gzip and deflate are decoded on the tee for
//     metering, any other coding is charged at the reservation.
//   - A stream that ends early (an error event after 200, an upstream cut
//     between events, a client that went away) is debited for what is
//     known: the input-side usage of message_start, and the larger of the
//     reported output and an estimate of the output delivered. A client
//     that goes away after message_start cancels the upstream call at once
//     instead of draining it: the user stopped the turn, and draining
//     would pay for output nobody reads.
//   - Usage that cannot be read books the reservation (outcome unmetered,
//     with a warning naming the call and why), never the figures read
//     before it: a final message_delta (or JSON answer) that is not JSON,
//     lacks usage or output_tokens, or holds a count of the wrong type or
//     below zero; a stream cut inside its message_delta; a stream that
//     ended (message_stop, or a clean end of the body) without one.
//   - Booking what may be billed (clientgone.go): the upstream call runs on
//     a context of its own, not the client's. A client that leaves before
//     the usage is known (a non-streaming call, or a stream before
//     message_start) does not end it: the gateway reads on, for at most
//     Config.ClientGoneWait, and books the usage the upstream reports. A
//     call the upstream took but whose usage never came (that wait ran
//     out, the upstream failed) is booked at its input-side worst case;
//     only a call that never reached the upstream is booked at zero.
//   - A budget smaller than one worst case (lower.go): a call refused for
//     its budget is admitted with max_tokens lowered to what the remaining
//     budget covers, when that is at least MinLoweredMaxTokens, and the
//     answer carries HeaderMaxTokensLowered.
//
// Main type: Handler. It does not mint tokens (package mint) or store prices
// and budgets (package budget).
package gateway

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/token"
)

// Fixed beginnings of the gateway's own refusal messages, which clients
// may match (docs/gateway-money.md).
const (
	// MsgBudgetExhausted begins the message of a budget denial (429,
	// details.error_code budget_exceeded).
	MsgBudgetExhausted = "TalkIDE budget exhausted:"
	// MsgTokenExpired is the message of a 401 for an expired WorkerToken
	// (details.error_code worker_token_expired).
	MsgTokenExpired = "worker token expired or not yet valid (clock skew?): mint a new one and send the request with it"
)

// Budget is the UserBudgetService as the gateway uses it.
type Budget interface {
	// PreCallCheckAsync starts reserving the call's worst case. A ticket
	// that is not Predicted has ended: its Result is the reservation or
	// the refusal (a *budget.DenyError or *budget.FairUseError). A
	// Predicted one is still committing: the gateway forwards the call,
	// holds the upstream's answer until Done, and cancels the call if the
	// Result is an error after all.
	PreCallCheckAsync(ctx context.Context, c budget.Call) *budget.Ticket
	// PostCallDebit replaces the reservation with the actual cost.
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
	Prices *budget.PriceTable
	// Transport reaches the upstream; nil means a tuned http.Transport
	// dialling with Dial.
	Transport http.RoundTripper
	// Dial opens the upstream connections of the tuned transport; nil
	// means a net.Dialer (10 s timeout). The control plane counts them in
	// its open-files budget (httpapi.Files.DialContext): a dial it refuses
	// answers the call 529 overloaded_error, which clients retry.
	Dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	Logger *slog.Logger
	// Metrics, when set, receives the gateway's measurements.
	Metrics *Metrics
	// ClientGoneWait bounds how long the gateway keeps an upstream call
	// going after its client left, to learn the usage it bills (see
	// clientgone.go). Zero means DefaultClientGoneWait.
	ClientGoneWait time.Duration
}

// DefaultClientGoneWait is Config.ClientGoneWait's default: the longest a
// non-streaming Messages call runs (the SDKs' own timeout).
const DefaultClientGoneWait = 10 * time.Minute

// MaxRequestBytes is the largest request body forwarded (Anthropic's own
// Messages limit, 32 MB).
const MaxRequestBytes = 32 << 20

// MaxOutputTokens bounds max_tokens of a call the gateway admits (16 Mi
// tokens: far above any model's output limit).
const MaxOutputTokens = 1 << 24

// HeaderOverhead is the response header that reports, in milliseconds with
// microsecond resolution, the latency the gateway added before forwarding.
const HeaderOverhead = "X-Talkide-Gateway-Overhead-Ms"

// Handler is the gateway-proxy.
type Handler struct {
	cfg      Config
	verifier *token.Verifier
	rp       *httputil.ReverseProxy
	log      *slog.Logger
	m        *Metrics
	// errs is the gateway's one error path (Anthropic's envelope).
	errs httpapi.Translator
	// serve is serveCall behind errs' panic recovery.
	serve http.Handler
	// settles tracks the background debits; Close waits for them.
	settles sync.WaitGroup
	// mu guards closed: once Close began, debits run on the caller's
	// goroutine instead of joining settles.
	mu     sync.Mutex
	closed bool
	// stopping ends when Close begins: upstream calls kept going for a
	// client that left are cut then (clientgone.go).
	stopping context.Context
	stop     context.CancelFunc
	// refusal is the upstream's last refusal of the API key (keyrefused.go),
	// nil since a call or a check went through.
	refusal atomic.Pointer[UpstreamError]
}

// New returns the gateway-proxy.
func New(cfg Config) *Handler {
	if cfg.Prices == nil {
		cfg.Prices = budget.DefaultPrices()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ClientGoneWait <= 0 {
		cfg.ClientGoneWait = DefaultClientGoneWait
	}
	if cfg.Transport == nil {
		dial := cfg.Dial
		if dial == nil {
			dial = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
		}
		cfg.Transport = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           dial,
			MaxIdleConns:          1024,
			MaxIdleConnsPerHost:   512,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ResponseHeaderTimeout: 10 * time.Minute,
			ForceAttemptHTTP2:     true,
		}
	}
	// Lines logged with a call's context carry its request id.
	h := &Handler{cfg: cfg, verifier: token.NewVerifier(token.PurposeGateway, cfg.Keys...), log: httpapi.WithRequestIDs(cfg.Logger), m: cfg.Metrics}
	h.stopping, h.stop = context.WithCancel(context.Background())
	h.errs = httpapi.Translator{Log: h.log, Body: httpapi.AnthropicBody}
	h.serve = h.errs.Recover(http.HandlerFunc(h.serveCall))
	h.rp = &httputil.ReverseProxy{
		Rewrite:        h.rewrite,
		Transport:      ticketTransport{next: cfg.Transport},
		FlushInterval:  -1, // flush every write: each SSE event reaches the worker at once
		ModifyResponse: h.modifyResponse,
		ErrorHandler:   h.proxyError,
		BufferPool:     bufferPool{},
		ErrorLog:       slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	return h
}

// Close waits until every call's debit is booked (or failed). Call it after
// the HTTP server stopped serving; a call still finishing after that books
// its debit before its handler returns. Upstream calls kept going for
// clients that left are cut, and booked at their input-side worst case.
func (h *Handler) Close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.stop()
	h.settles.Wait()
}

// background runs f on its own goroutine tracked by settles, or right here
// once Close began.
func (h *Handler) background(f func()) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		f()
		return
	}
	h.settles.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.settles.Done()
		f()
	}()
}

// bufferPool recycles the 32 KB copy buffers of relayed answers.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }

type call struct {
	claims  *token.Claims
	apiPath string
	model   string
	// floor is what the call is booked at when the upstream took it but
	// its usage never came: its input-side worst case, in nano-USD.
	floor budget.NanoUSD
	// lowered is the max_tokens the call was forwarded with when the
	// gateway lowered it to fit the budget (lower.go), else 0.
	lowered int64
	// ticket is the call's pre-call check (nil for count_tokens, which is
	// free); once it is Done without error, res is its reservation.
	ticket    *budget.Ticket
	res       budget.Reservation
	requestID string
	start     time.Time
	forwarded time.Time
	// client is the incoming request's context: done when the client left.
	client context.Context
	// up is the upstream call's own context and its cancel (metered calls;
	// see clientgone.go).
	up       context.Context
	cancelUp context.CancelFunc
	// unwatch stops watching for the client leaving.
	unwatch func() bool
	// wrote is set once the request was written to the upstream: from
	// then on the upstream may bill it.
	wrote atomic.Bool
	// gone is set when the client left before the usage was known.
	gone atomic.Bool
	// meter is the answer being metered, once the upstream's headers came.
	meter atomic.Pointer[meteredBody]
	// goneOnce arms the bound on a call kept going for a gone client once;
	// disarm ends it.
	goneOnce sync.Once
	disarm   func()
}

type ctxKey struct{}

func gatewayRequestID() string { return "req_gw_" + token.NewID()[:20] }

// refusal is a call the gateway answers itself: the answer, and the
// label of the denials metric it counts under.
type refusal struct {
	reason string
	err    *httpapi.Error
}

// refused returns the refusal with metric label reason, status, Anthropic
// error type typ and client message msg.
func refused(reason string, status int, typ, msg string) *refusal {
	return &refusal{reason: reason, err: &httpapi.Error{Status: status, Type: typ, Msg: msg}}
}

// ServeHTTP handles one call. Its own answers (refusals, an upstream that
// failed, a panic) are Anthropic error envelopes naming the call's request
// id: the control plane's (httpapi.RequestIDs), replaced by the one the
// caller sent once its WorkerToken checks out (the worker's local proxy
// sends its own), or a gateway id when the gateway runs without that
// middleware.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if httpapi.RequestID(r.Context()) == "" {
		r = r.WithContext(httpapi.WithRequestID(r.Context(), gatewayRequestID()))
	}
	h.serve.ServeHTTP(w, r)
}

func (h *Handler) serveCall(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	apiPath := strings.TrimPrefix(r.URL.Path, contract.PathGatewayPrefix)
	c, ref := h.admit(w, r, apiPath, start)
	if ref != nil {
		h.refuse(w, r, apiPath, ref)
		return
	}
	if c == nil {
		return // the client went away while the body was read
	}
	if c.lowered > 0 {
		w.Header().Set(HeaderMaxTokensLowered, strconv.FormatInt(c.lowered, 10))
	}
	defer func() {
		if c.unwatch != nil {
			c.unwatch() // also when the reverse proxy aborts the handler
		}
	}()
	h.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, c)))
}

// refuse counts f and answers it through the gateway's error path: one
// log line with f's reason and cause, and Anthropic's error envelope
// (httpapi.AnthropicBody).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, apiPath string, f *refusal) {
	if !contract.GatewayForwards(apiPath) {
		apiPath = "other"
	}
	h.m.deny(f.reason)
	h.m.request(apiPath, f.err.Status)
	h.errs.With("gateway refused call", "reason", f.reason).Write(w, r, f.err)
}

// admit checks the call and reserves its budget. It returns the call to
// forward, or the refusal to answer, or neither when the client is gone.
// On success r's body is replaced by the bytes read.
func (h *Handler) admit(w http.ResponseWriter, r *http.Request, apiPath string, start time.Time) (*call, *refusal) {
	if !contract.GatewayForwards(apiPath) {
		return nil, refused("not_found", http.StatusNotFound, anthropic.ErrNotFound,
			"the gateway forwards only /v1/messages and /v1/messages/count_tokens")
	}
	if r.Method != http.MethodPost {
		ref := refused("method", http.StatusMethodNotAllowed, anthropic.ErrInvalidRequest, "method not allowed")
		ref.err.Header = http.Header{"Allow": {http.MethodPost}}
		return nil, ref
	}
	raw := r.Header.Get(contract.HeaderWorkerToken)
	if raw == "" {
		return nil, refused("auth", http.StatusUnauthorized, anthropic.ErrAuthentication, "missing X-Worker-Token")
	}
	claims, err := h.verifier.Verify(raw)
	if err != nil {
		// A warning, as at the mint and the worker (a forged or foreign
		// credential is worth an alert); the cause is on the error line.
		h.log.WarnContext(r.Context(), "gateway refused worker token", "token", token.Fingerprint(raw))
		ref := refused("auth", http.StatusUnauthorized, anthropic.ErrAuthentication, "invalid or expired worker token")
		ref.err.Err = err
		if errors.Is(err, token.ErrExpired) || errors.Is(err, token.ErrNotYetValid) {
			// Sending the same request again sends the same token: an
			// Anthropic SDK talking to the gateway directly must not
			// retry (x-should-retry: false) but mint a new token, which
			// details.error_code tells it (docs/direct-sdk.md). The
			// worker's local proxy mints per request, so it turns this
			// answer into a retry for the CLI (localproxy.retryExpired).
			ref.err.Msg = MsgTokenExpired
			ref.reason = "auth_expired"
			ref.err.Header = http.Header{"X-Should-Retry": {"false"}}
			ref.err.Details = map[string]any{"error_code": contract.ErrCodeTokenExpired}
		}
		return nil, ref
	}
	// A WorkerToken checks out: the id the worker's local proxy sent for
	// this model call names it here too.
	reqID := httpapi.AdoptRequestID(w, r)
	if claims.Conversation == "" || claims.User == "" {
		return nil, refused("forbidden", http.StatusForbidden, anthropic.ErrPermission, "worker token not scoped to a conversation")
	}
	tooLarge := refused("too_large", http.StatusRequestEntityTooLarge, anthropic.ErrTooLarge, "request body over 32 MB")
	if r.ContentLength > MaxRequestBytes {
		return nil, tooLarge
	}
	body, err := readBody(w, r)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge
		}
		if r.Context().Err() != nil {
			return nil, nil
		}
		// The cause (a cut connection, a broken chunked body) is for the log;
		// the client gets a message that names no internals.
		ref := refused("bad_request", http.StatusBadRequest, anthropic.ErrInvalidRequest, "the request body could not be read")
		ref.err.Err = err
		return nil, ref
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	c := &call{claims: claims, apiPath: apiPath, requestID: reqID, start: start, client: r.Context()}
	if apiPath != "/v1/messages" {
		return c, nil // count_tokens is free
	}
	q, ref := quoteBody(h.cfg.Prices, body, start)
	if ref != nil {
		return nil, ref
	}
	head, price, prompt, tools := q.head, q.price, q.prompt, q.tools
	c.model = head.Model
	c.floor = q.floor
	call := budget.Call{
		UserID: claims.User, Tenant: claims.Tenant, Env: claims.Env, ConversationID: claims.Conversation,
		Model: head.Model, RequestID: reqID, Amount: q.amount, EstimatedTokens: prompt,
	}
	t := h.cfg.Budget.PreCallCheckAsync(r.Context(), call)
	c.ticket = t
	if t.Predicted {
		return c, nil // forwarded while the reservation commits (ticketTransport)
	}
	res, err := t.Result()
	var deny *budget.DenyError
	if errors.As(err, &deny) {
		// The call's worst case does not fit: admit it with max_tokens
		// lowered to what the rest of the budget covers, if that is
		// enough to be of use (lower.go).
		if n, ok := lowerMaxTokens(price, prompt, head, tools, deny); ok {
			lowered, _ := head.WithMaxTokens(body, n)
			call.Amount = price.WorstCaseWithTools(prompt, n, tools)
			t2 := h.cfg.Budget.PreCallCheckAsync(r.Context(), call)
			res2, err2 := t2.Result() // after a refusal nothing is predicted; wait either way
			if err2 == nil {
				t, res, err = t2, res2, nil
				c.ticket, c.lowered = t2, n
				body = lowered
				r.Body = io.NopCloser(bytes.NewReader(body))
				r.ContentLength = int64(len(body))
				h.log.Info("gateway lowered max_tokens to fit the budget", "tenant", claims.Tenant, "conversation", claims.Conversation,
					"user", claims.User, "request_id", reqID, "max_tokens", head.MaxTokens, "lowered_to", n)
			} else if !errors.As(err2, &deny) {
				err = err2
			}
		}
	}
	if err != nil {
		if r.Context().Err() != nil {
			return nil, nil
		}
		return nil, h.budgetRefusal(err, claims)
	}
	c.res = res
	return c, nil
}

// budgetRefusal is the answer to a pre-call check that failed with err.
func (h *Handler) budgetRefusal(err error, claims *token.Claims) *refusal {
	var deny *budget.DenyError
	var fair *budget.FairUseError
	switch {
	case errors.As(err, &deny):
		// Not retryable now (x-should-retry: false, which Anthropic's SDKs
		// obey over the status), but retry-after says when the period
		// resets, so a client need not read details to tell it from a
		// transient rate limit (docs/gateway-money.md, "Refusals").
		ref := refused("budget", http.StatusTooManyRequests, anthropic.ErrRateLimit,
			fmt.Sprintf(MsgBudgetExhausted+" your spending limit for %s is $%s, $%s of it is used or held by calls in progress, and this call could cost up to $%s. It resets at %s; ask your administrator to raise the limit.",
				deny.Period, budget.FormatUSD(deny.Limit), budget.FormatUSD(deny.Committed), budget.FormatUSD(deny.Needed), deny.Resets.UTC().Format(time.RFC3339)))
		ref.err.Err = fmt.Errorf("tenant %s env %s conversation %s: %w", claims.Tenant, claims.Env, claims.Conversation, err)
		ref.err.Header = http.Header{"X-Should-Retry": {"false"}, "Retry-After": {strconv.FormatInt(secondsUntil(deny.Resets), 10)}}
		ref.err.Details = map[string]any{"error_code": contract.ErrCodeBudgetExceeded, "period": deny.Period,
			"resets_at": deny.Resets.UTC().Format(time.RFC3339)}
		return ref
	case errors.As(err, &fair):
		secs := int64((fair.RetryAfter + time.Second - 1) / time.Second)
		ref := refused("fair_use_"+fair.Limit, http.StatusTooManyRequests, anthropic.ErrRateLimit,
			fmt.Sprintf("TalkIDE fair-use limit: too many %s in a short time; try again in %d s.", fair.Limit, secs))
		ref.err.Err = err
		ref.err.Header = http.Header{"Retry-After": {strconv.FormatInt(secs, 10)}}
		ref.err.Details = map[string]any{"error_code": contract.ErrCodeFairUse, "limit": fair.Limit}
		return ref
	}
	ref := refused("budget_error", http.StatusServiceUnavailable, anthropic.ErrAPI, "budget service unavailable")
	ref.err.Err = fmt.Errorf("user %s: %w", claims.User, err)
	return ref
}

// secondsUntil is the whole seconds from now until t, rounded up, at least 1.
func secondsUntil(t time.Time) int64 {
	return max(1, int64((time.Until(t)+time.Second-1)/time.Second))
}

// readBody reads the request body, at most MaxRequestBytes, into one buffer
// sized by Content-Length when the client sent one.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	rd := http.MaxBytesReader(w, r.Body, MaxRequestBytes)
	if n := r.ContentLength; n > 0 && n <= MaxRequestBytes {
		buf := make([]byte, n)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return nil, err
		}
		// Content-Length is the whole body; a longer one is the
		// server's concern (it refuses it before we read).
		return buf, nil
	}
	return io.ReadAll(rd)
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
	// decoding; the bytes reach the worker exactly as the upstream sent
	// them either way.
	pr.Out.Header.Set("Accept-Encoding", "identity")
	if c.ticket != nil {
		// A metered call runs upstream on a context of its own, so a
		// client that leaves before its usage is known does not end it
		// (clientgone.go).
		h.detach(pr, c)
	}
	c.forwarded = time.Now()
	h.m.observeOverhead(c.forwarded.Sub(c.start))
}

func (h *Handler) modifyResponse(resp *http.Response) error {
	c := resp.Request.Context().Value(ctxKey{}).(*call)
	if resp.StatusCode == http.StatusUnauthorized {
		h.keyRefused(resp, c)
	} else if resp.StatusCode < 300 && h.refusal.Load() != nil {
		h.refusal.Store(nil)
	}
	h.m.observeUpstream(c.apiPath, time.Since(c.forwarded))
	h.m.request(c.apiPath, resp.StatusCode)
	hdr := resp.Header
	// Reverse proxies in front of the control plane must not buffer.
	hdr.Set("X-Accel-Buffering", "no")
	stream := strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream")
	if stream && hdr.Get("Cache-Control") == "" {
		hdr.Set("Cache-Control", "no-cache")
	}
	hdr.Set(HeaderOverhead, strconv.FormatFloat(float64(c.forwarded.Sub(c.start).Microseconds())/1000, 'f', 3, 64))
	if !stream {
		nameRequest(resp, c.requestID)
	}
	if c.ticket == nil {
		return nil // not metered: count_tokens is free
	}
	m := &meteredBody{rc: resp.Body, h: h, c: c, status: resp.StatusCode, requestID: hdr.Get("Request-Id")}
	var sink io.Writer = &m.buf
	if stream {
		m.stream = &anthropic.StreamMeter{}
		sink = m.stream
	}
	m.tee = sink
	switch enc := strings.ToLower(strings.TrimSpace(hdr.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip", "deflate":
		m.decoder = newDecodeTee(enc, sink)
		m.tee = m.decoder
	default:
		m.undecodable = enc // passed through, charged at the reservation
	}
	if m.tee != sink || m.undecodable != "" {
		// Compressed: the meter is fed on another goroutine (or not at
		// all), so the call is treated as past message_start: a client
		// that leaves cancels it at once, as before.
		m.started.Store(true)
	}
	h.m.streams(1)
	resp.Body = m
	c.meter.Store(m)
	return nil
}

// settle books the call's cost in the background.
func (h *Handler) settle(c *call, u anthropic.Usage, cost budget.NanoUSD, outcome, requestID string) {
	h.background(func() { h.book(c, u, cost, outcome, requestID) })
}

// atReservation, as book's cost, books the call at its whole reservation.
const atReservation budget.NanoUSD = -1

// book waits for the call's reservation and replaces it with cost (the
// postCallDebit; atReservation: the reservation's amount), retrying a
// failed debit twice.
func (h *Handler) book(c *call, u anthropic.Usage, cost budget.NanoUSD, outcome, requestID string) {
	c.release()
	if requestID == "" {
		requestID = c.requestID
	}
	res, err := c.ticket.Result()
	if err != nil {
		return // refused or failed: nothing was reserved
	}
	if cost == atReservation {
		cost = res.Amount
	}
	d := budget.Debit{ConversationID: c.claims.Conversation, RequestID: requestID, Outcome: outcome, Usage: u}
	for attempt := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = h.cfg.Budget.PostCallDebit(ctx, res, cost, d)
		cancel()
		if err == nil || errors.Is(err, budget.ErrClosed) {
			break
		}
		time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
	}
	model := "other"
	if _, known := h.cfg.Prices.Lookup(u.Model, c.start); known {
		model = u.Model
	}
	h.m.settled(model, u, cost, outcome, err)
	if err != nil {
		// The reservation stays open and is charged in full when it
		// expires: the debit is not lost, only overstated.
		h.log.Error("post-call debit failed", "tenant", c.claims.Tenant, "conversation", c.claims.Conversation, "user", c.claims.User,
			"request_id", requestID, "cost_nano_usd", cost, "outcome", outcome, "err", err)
		return
	}
	h.log.Debug("call settled", "tenant", c.claims.Tenant, "env", c.claims.Env, "conversation", c.claims.Conversation, "user", c.claims.User,
		"request_id", requestID, "model", u.Model, "outcome", outcome, "input_tokens", u.InputTokens, "output_tokens", u.OutputTokens,
		"cache_write_tokens", u.CacheCreationInputTokens, "cache_read_tokens", u.CacheReadInputTokens,
		"cost_nano_usd", cost, "duration_ms", time.Since(c.start).Milliseconds())
}

func (h *Handler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	c, _ := r.Context().Value(ctxKey{}).(*call)
	var late *lateRefusal
	if errors.As(err, &late) {
		// Refused after it was forwarded: the upstream call was cancelled
		// before any of its answer reached the client.
		h.refuse(w, r, c.apiPath, h.budgetRefusal(late.err, c.claims))
		return
	}
	if c != nil && c.ticket != nil {
		if c.wrote.Load() {
			// The upstream took the request and no usage came back (it
			// failed, or the client left and the wait ran out): it may
			// bill at least the input.
			h.settle(c, anthropic.Usage{Model: c.model}, c.floor, "no_usage", "")
		} else {
			// The request never reached the upstream: nothing to bill.
			h.settle(c, anthropic.Usage{Model: c.model}, 0, "no_answer", "")
		}
	}
	path := "other"
	reqID := ""
	var client context.Context = r.Context()
	if c != nil {
		path, reqID, client = c.apiPath, c.requestID, c.client
	}
	if client.Err() != nil {
		h.log.Info("gateway client went away", "status", httpapi.StatusClientClosed, "request_id", reqID)
		h.m.request(path, httpapi.StatusClientClosed)
		return
	}
	h.upstreamFailed(w, r, path, err)
}

// ticketTransport reaches the upstream for a call whose reservation may
// still be committing (a Predicted ticket): it forwards at once, cancels the
// upstream call as soon as the reservation is refused, and hands the
// upstream's answer on only once the reservation is durable. Other calls
// pass straight through.
type ticketTransport struct{ next http.RoundTripper }

// lateRefusal is a pre-call check that failed after its call was forwarded.
type lateRefusal struct{ err error }

func (e *lateRefusal) Error() string {
	return "pre-call check failed after forwarding: " + e.err.Error()
}
func (e *lateRefusal) Unwrap() error { return e.err }

func (t ticketTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c, _ := req.Context().Value(ctxKey{}).(*call)
	if c == nil || c.ticket == nil || !c.ticket.Predicted {
		return t.next.RoundTrip(req)
	}
	select {
	case <-c.ticket.Done():
		res, err := c.ticket.Result()
		if err != nil {
			return nil, &lateRefusal{err}
		}
		c.res = res
		return t.next.RoundTrip(req)
	default:
	}
	// A context of its own, ended with the client's: it carries the call
	// but none of the reverse proxy's hooks, which would relay a 1xx
	// answer before the reservation is durable.
	base := context.WithValue(context.Background(), ctxKey{}, c)
	if tr := httptrace.ContextClientTrace(c.up); tr != nil {
		base = httptrace.WithClientTrace(base, tr) // c.wrote
	}
	ctx, cancelCtx := context.WithCancel(base)
	stop := context.AfterFunc(req.Context(), cancelCtx)
	cancel := func() { stop(); cancelCtx() }
	go func() {
		select {
		case <-c.ticket.Done():
			if _, err := c.ticket.Result(); err != nil {
				cancel()
			}
		case <-ctx.Done():
		}
	}()
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	c.ticket.Begin() // the answer is here: nothing left to overlap the commit with
	res, terr := c.ticket.Result()
	if terr != nil {
		if resp != nil {
			resp.Body.Close()
		}
		cancel()
		return nil, &lateRefusal{terr}
	}
	c.res = res
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelOnClose ends the context of an upstream call when its body is
// closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel func()
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// maxJSONMeter bounds the copy of a non-streaming answer kept to read its
// usage; Messages answers are far smaller.
const maxJSONMeter = 8 << 20

// meteredBody passes the upstream body through unchanged while reading usage
// from a copy, and settles the call once, when the body ends or is closed.
type meteredBody struct {
	rc        io.ReadCloser
	h         *Handler
	c         *call
	status    int
	requestID string
	stream    *anthropic.StreamMeter // nil: a JSON answer, kept in buf
	buf       limitedBuffer
	tee       io.Writer  // where read bytes are copied: the meter, buf or decoder
	decoder   *decodeTee // set when the upstream compressed the answer
	received  int64      // bytes read from the upstream
	readErr   error      // the first read error other than EOF
	eof       bool       // the upstream's answer ended
	once      sync.Once
	// undecodable is a Content-Encoding the tee cannot read.
	undecodable string
	// started is set once a stream's message_start was read.
	started atomic.Bool
	// drained is set when the answer was read on after the client left.
	drained bool
}

func (m *meteredBody) Read(p []byte) (int, error) {
	n, err := m.rc.Read(p)
	if n > 0 {
		m.received += int64(n)
		m.tee.Write(p[:n])
		if m.stream != nil && !m.started.Load() && m.stream.Started() { // an uncompressed stream: the meter is ours
			m.started.Store(true)
			if m.c.gone.Load() {
				// The client left before message_start: the input-side
				// usage is known now, and the output nobody reads is
				// not worth paying for.
				m.c.cancelUp()
			}
		}
	}
	if err == io.EOF {
		m.eof = true // settled at Close, after the last bytes reached the client
	} else if err != nil && m.readErr == nil {
		m.readErr = err
	}
	return n, err
}

// Close settles the call; the reverse proxy closes the body once it has
// relayed (and flushed) all of it, or given up.
func (m *meteredBody) Close() error {
	if !m.eof && m.readErr == nil && !m.started.Load() {
		// The relay stopped before the usage was known: the client is
		// gone. Read on for it, bounded (clientgone.go).
		m.c.gone.Store(true)
		m.h.background(m.drain)
		return nil
	}
	err := m.rc.Close()
	m.finish(m.eof)
	return err
}

// finish settles the call once, in the background: working out the cost
// (parsing a JSON answer's usage, say) is no reason to keep the client
// waiting.
func (m *meteredBody) finish(eof bool) {
	m.once.Do(func() {
		m.h.m.streams(-1)
		clientGone := m.c.client.Err() != nil
		m.h.background(func() { m.settle(eof, clientGone) })
	})
}

// settle works out what the call cost and books it.
func (m *meteredBody) settle(eof, clientGone bool) {
	h, c := m.h, m.c
	var decodeErr error
	if m.decoder != nil {
		decodeErr = m.decoder.finish()
	}
	var u anthropic.Usage
	// final: the usage that settles the call came and was read (a JSON
	// answer's is its only one).
	final := true
	if m.stream != nil {
		u, final = m.stream.Ended()
	} else if m.buf.overflow {
		u.Unreadable = fmt.Sprintf("the answer is over %d bytes, more than the meter keeps", maxJSONMeter)
	} else if m.received > 0 {
		u, _ = anthropic.ParseMessageUsage(m.buf.Bytes())
	}
	if u.Model == "" {
		u.Model = c.model
	}
	complete := u.Finished && final
	outcome := "complete"
	switch {
	case m.status != http.StatusOK:
		// Anthropic does not bill calls that fail with an error status.
		h.book(c, u, 0, "http_error", m.requestID)
		return
	case m.undecodable != "" || (!u.Started && u.ErrorType == "" && u.Unreadable == "" && m.received > 0):
		// Bytes came back that the tee could not read: charge the
		// reservation, never nothing.
		h.log.Warn("answer not metered: charging the reservation", "request_id", c.requestID, "content_encoding", m.undecodable,
			"decode_err", decodeErr, "received_bytes", m.received)
		h.book(c, u, atReservation, "unmetered", m.requestID)
		return
	case u.Unreadable != "":
		// The usage that settles the call came but cannot be read: the
		// figures read before it (message_start's one output token)
		// are not what the call cost.
		m.unreadable(u, u.Unreadable)
		return
	case !u.Started && u.ErrorType != "":
		h.book(c, u, 0, "stream_error", m.requestID)
		return
	case !u.Started:
		// The upstream took the call and sent no usage (it cut the
		// answer, or the client left and the wait ran out): it may bill
		// at least the input.
		h.book(c, u, c.floor, "no_usage", m.requestID)
		return
	case u.ErrorType != "":
		outcome = "stream_error"
	case clientGone || m.drained:
		outcome = "client_disconnect"
	case complete:
	case !final && u.Finished:
		m.unreadable(u, "message_stop without a message_delta usage")
		return
	case !final && eof && m.readErr == nil:
		m.unreadable(u, "the stream ended without message_delta or message_stop")
		return
	case m.readErr != nil || !eof:
		outcome = "upstream_cut"
	default:
		outcome = "incomplete"
	}
	billed := u
	billed.OutputTokens = u.BilledOutputTokens(complete)
	price, _ := h.cfg.Prices.PriceFor(u.Model, c.start)
	h.book(c, billed, price.Cost(billed), outcome, m.requestID)
}

// unreadable books a call whose settling usage could not be read (why) at
// its reservation, outcome unmetered, with a warning naming the call.
func (m *meteredBody) unreadable(u anthropic.Usage, why string) {
	h, c := m.h, m.c
	h.log.Warn("usage unreadable: charging the reservation", "tenant", c.claims.Tenant, "env", c.claims.Env,
		"conversation", c.claims.Conversation, "user", c.claims.User, "request_id", c.requestID,
		"upstream_request_id", m.requestID, "model", u.Model, "reason", why, "received_bytes", m.received)
	h.book(c, u, atReservation, "unmetered", m.requestID)
}

// limitedBuffer keeps the first maxJSONMeter bytes written to it.
type limitedBuffer struct {
	bytes.Buffer
	overflow bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > maxJSONMeter {
		b.overflow = true
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// errDecode stops a decodeTee's writer once decoding failed.
var errDecode = errors.New("decode answer for metering")

// decodeTee decodes a compressed answer for the meter on its own goroutine,
// fed through a pipe; the bytes relayed to the client are untouched. Memory
// is bounded by the decoder's window. Writes never fail.
type decodeTee struct {
	pw   *io.PipeWriter
	done chan struct{}
	err  error // set before done closes
}

func newDecodeTee(enc string, dst io.Writer) *decodeTee {
	pr, pw := io.Pipe()
	d := &decodeTee{pw: pw, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		var r io.Reader
		var err error
		if enc == "deflate" {
			r, err = zlib.NewReader(pr)
		} else {
			r, err = gzip.NewReader(pr)
		}
		if err == nil {
			_, err = io.Copy(dst, r)
		}
		d.err = err
		pr.CloseWithError(errDecode) // later writes return at once
	}()
	return d
}

func (d *decodeTee) Write(p []byte) (int, error) {
	_, _ = d.pw.Write(p)
	return len(p), nil
}

// finish ends the input and waits for the decoder; it returns the decoding
// error, if any (a cut stream ends in io.ErrUnexpectedEOF).
func (d *decodeTee) finish() error {
	d.pw.Close()
	<-d.done
	return d.err
}
