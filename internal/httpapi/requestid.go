package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
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

// NewRequestID returns a fresh id: "req_" and 20 random base32 characters
// (100 bits).
func NewRequestID() string {
	var b [13]byte
	_, _ = rand.Read(b[:])
	return "req_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))[:20]
}

// WithRequestID returns ctx carrying request id id.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, ctxKeyRequestID{}, id)
}

// RequestID returns the request id ctx carries, or "".
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(ctxKeyRequestID{}).(string)
	return id
}

// SetRequestID sets HeaderRequestID on an outgoing request from the id its
// context carries (nothing when it carries none).
func SetRequestID(r *http.Request) {
	if id := RequestID(r.Context()); id != "" {
		r.Header.Set(HeaderRequestID, id)
	}
}

// RequestIDs gives every request an id before h sees it: the incoming
// HeaderRequestID when trusted(r) says the caller is a TalkIDE process whose
// ids may be kept and the id is well formed, else a new one. The id is in
// the request's context (RequestID), answered in HeaderRequestID, and in
// every error body WriteError writes. A nil trusted trusts no caller.
func RequestIDs(h http.Handler, trusted func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(HeaderRequestID)
		if id == "" || trusted == nil || !trusted(r) || !validRequestID.MatchString(id) {
			id = NewRequestID()
		}
		w.Header().Set(HeaderRequestID, id)
		h.ServeHTTP(w, r.WithContext(WithRequestID(r.Context(), id)))
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
