package gateway

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
