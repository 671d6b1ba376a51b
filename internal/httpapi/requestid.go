package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
)

// HeaderRequestID carries a request's id: answered on every response, and
// sent by a TalkIDE process to the next one it calls on behalf of the
// request (control plane → worker, local proxy → gateway), so one id finds
// a request's lines in the logs of every process it crossed.
const HeaderRequestID = "X-Request-Id"

// validRequestID accepts the ids this package makes and those of common
// proxies: 1-64 characters of [A-Za-z0-9._:-], nothing a log line or a
// header could be confused by.
var validRequestID = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

type ctxKeyRequestID struct{}

// requestIDs is what a request's context carries: its id, which
// AdoptRequestID may replace by the one its caller claimed.
type requestIDs struct {
	id      atomic.Pointer[string]
	claimed string
}

// NewRequestID returns a fresh id: "req_" and 20 random base32 characters
// (100 bits).
func NewRequestID() string {
	var b [13]byte
	_, _ = rand.Read(b[:])
	return "req_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))[:20]
}

// WithRequestID returns ctx carrying request id id.
func WithRequestID(ctx context.Context, id string) context.Context {
	return withRequestIDs(ctx, id, "")
}

func withRequestIDs(ctx context.Context, id, claimed string) context.Context {
	ids := &requestIDs{claimed: claimed}
	ids.id.Store(&id)
	return context.WithValue(ctx, ctxKeyRequestID{}, ids)
}

// RequestID returns the request id ctx carries, or "".
func RequestID(ctx context.Context) string {
	if ids, ok := ctx.Value(ctxKeyRequestID{}).(*requestIDs); ok {
		return *ids.id.Load()
	}
	return ""
}

// AdoptRequestID makes the id r's caller sent in HeaderRequestID (when well
// formed) the request's id, and returns the request's id. A handler calls
// it once it has authenticated the caller as a TalkIDE process (a worker's
// identity token at the mint, a WorkerToken at the gateway, the control
// plane's request signature at a worker), so that one model call or one
// browser request has one id in every process's log; an unauthenticated
// caller cannot choose the id its lines are logged under. From then on the
// id is r's context's (every later log line, the request's access-log line,
// error bodies) and is answered in HeaderRequestID. Without RequestIDs'
// middleware, or when the caller sent none, the id stays.
func AdoptRequestID(w http.ResponseWriter, r *http.Request) string {
	ids, ok := r.Context().Value(ctxKeyRequestID{}).(*requestIDs)
	if !ok {
		return ""
	}
	if ids.claimed != "" {
		id := ids.claimed
		ids.id.Store(&id)
		w.Header().Set(HeaderRequestID, id)
	}
	return *ids.id.Load()
}

// SetRequestID sets HeaderRequestID on an outgoing request from the id its
// context carries (nothing when it carries none).
func SetRequestID(r *http.Request) {
	if id := RequestID(r.Context()); id != "" {
		r.Header.Set(HeaderRequestID, id)
	}
}

// RequestIDs gives every request a new id before h sees it, in the
// request's context (RequestID), answered in HeaderRequestID, and in every
// error body a Translator writes. The id a caller sends in HeaderRequestID
// is kept aside (when well formed: 1-64 characters of [A-Za-z0-9._:-]) and
// becomes the request's id only if a handler adopts it after
// authenticating the caller (AdoptRequestID).
func RequestIDs(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, claimed := NewRequestID(), r.Header.Get(HeaderRequestID)
		if !validRequestID.MatchString(claimed) {
			claimed = ""
		}
		w.Header().Set(HeaderRequestID, id)
		h.ServeHTTP(w, r.WithContext(withRequestIDs(r.Context(), id, claimed)))
	})
}

// LogHandler wraps h so that every record logged with a context carrying a
// request id (slog's *Context methods, Logger.Log) has it as "request_id".
func LogHandler(h slog.Handler) slog.Handler { return requestIDHandler{h} }

type requestIDHandler struct{ slog.Handler }

func (h requestIDHandler) Handle(ctx context.Context, r slog.Record) error {
	if id := RequestID(ctx); id != "" {
		r.AddAttrs(slog.String("request_id", id))
	}
	return h.Handler.Handle(ctx, r)
}

func (h requestIDHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return requestIDHandler{h.Handler.WithAttrs(as)}
}

func (h requestIDHandler) WithGroup(name string) slog.Handler {
	return requestIDHandler{h.Handler.WithGroup(name)}
}

// WithRequestIDs returns l logging through LogHandler (l itself when it
// already does).
func WithRequestIDs(l *slog.Logger) *slog.Logger {
	if _, ok := l.Handler().(requestIDHandler); ok {
		return l
	}
	return slog.New(LogHandler(l.Handler()))
}
