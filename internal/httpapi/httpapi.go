// Package httpapi holds the HTTP plumbing every TalkIDE server shares:
// handlers that return errors; one error type and, per API family, one
// translator that logs an error once and answers it in the family's shape
// (the platform's JSON, contract.ErrorBody, or Anthropic's error envelope
// on the gateway-proxy and the local proxy); request ids; bounded JSON
// request decoding; panics turned into 500s; and hardened http.Server
// settings.
//
// Main types: Error (a safe client message kept apart from the logged
// cause), Translator (an API family's error path: Write, Handle, Recover,
// Routes) with its body writers PlatformBody and AnthropicBody, HandlerFunc
// (an http handler that returns an error), RequestIDs and AdoptRequestID,
// and Server settings via NewServer. It does not route, authenticate or
// know any endpoint.
package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/contract"
)

// Error is the one error type of every TalkIDE HTTP API: the status, the
// message a client may see, and the cause, which is logged but never sent.
// A Translator turns it into one log line and one answer in its API
// family's shape (PlatformBody, AnthropicBody).
type Error struct {
	Status int
	// Type is the family's error type: a contract.ErrType* value, or on an
	// Anthropic-family route an anthropic.Err* value. AnthropicBody maps a
	// platform type (e.g. from ReadBody, or a panic) by Status.
	Type string
	// Msg is safe to show to the client.
	Msg string
	// Err is the cause, for the log.
	Err error
	// Header holds extra response headers (e.g. Retry-After).
	Header http.Header
	// Details is machine-readable data for the client, e.g.
	// {"error_code":"budget_exceeded"}. AnthropicBody sends it as
	// error.details; PlatformBody does not send it.
	Details map[string]any
}

// Error is "<status> <type>: <message>: <cause>", without the message when
// the cause already says it (a worker's refusal passed on, say).
func (e *Error) Error() string {
	if e.Err != nil {
		if cause := e.Err.Error(); strings.Contains(cause, e.Msg) {
			return fmt.Sprintf("%d %s: %s", e.Status, e.Type, cause)
		}
		return fmt.Sprintf("%d %s: %s: %v", e.Status, e.Type, e.Msg, e.Err)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Msg)
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error with status, type and a formatted client message.
func Errorf(status int, typ, format string, args ...any) *Error {
	return &Error{Status: status, Type: typ, Msg: fmt.Sprintf(format, args...)}
}

// Wrap returns an *Error with status, type, client message msg and cause err.
func Wrap(status int, typ, msg string, err error) *Error {
	return &Error{Status: status, Type: typ, Msg: msg, Err: err}
}

// Common errors.
func BadRequest(format string, args ...any) *Error {
	return Errorf(http.StatusBadRequest, contract.ErrTypeInvalidRequest, format, args...)
}

func NotFound(format string, args ...any) *Error {
	return Errorf(http.StatusNotFound, contract.ErrTypeNotFound, format, args...)
}

func Unauthorized(msg string, cause error) *Error {
	return Wrap(http.StatusUnauthorized, contract.ErrTypeUnauthorized, msg, cause)
}

func Forbidden(msg string, cause error) *Error {
	return Wrap(http.StatusForbidden, contract.ErrTypeForbidden, msg, cause)
}

// StatusClientClosed is logged (never sent) when the client went away
// before the answer, as nginx does; it keeps such cases out of 5xx counts.
const StatusClientClosed = 499

// HandlerFunc is an HTTP handler that returns an error instead of writing
// one. A nil error means the handler wrote its answer.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// ErrorBody writes e as an answer in one API family's wire shape: its
// status, e.Header and a body naming the request id r's context carries.
// PlatformBody and AnthropicBody are the two families.
type ErrorBody func(w http.ResponseWriter, r *http.Request, e *Error)

// Translator is an API family's one error path: it logs an error once
// (the cause included) and answers it with Body, so every route of the
// family (its handlers, its panics, its unknown paths) answers in one
// shape. The zero Translator is unusable; Log is required.
type Translator struct {
	// Log gets one line per error: at error level for a 5xx, else info.
	Log *slog.Logger
	// Body writes the answer; nil means PlatformBody.
	Body ErrorBody
	// LogMsg is the log line's message; "" means "request failed".
	LogMsg string
}

// With returns t whose log line says msg (t's own when msg is "") and
// carries the attributes args, for one kind of failure of a family.
func (t Translator) With(msg string, args ...any) Translator {
	if msg != "" {
		t.LogMsg = msg
	}
	if len(args) > 0 {
		t.Log = t.Log.With(args...)
	}
	return t
}

// Platform returns the Translator of the platform's own JSON APIs.
func Platform(log *slog.Logger) Translator { return Translator{Log: log} }

func (t Translator) body() ErrorBody {
	if t.Body == nil {
		return PlatformBody
	}
	return t.Body
}

// Handle adapts h to an http.Handler whose errors go through t.Write.
func (t Translator) Handle(h HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			t.Write(w, r, err)
		}
	})
}

// Write logs err once and answers it. An err that is not an *Error becomes
// a 500 "internal error" (its text only in the log); a cancelled request
// context is logged as 499 and not answered.
func (t Translator) Write(w http.ResponseWriter, r *http.Request, err error) {
	var he *Error
	if !errors.As(err, &he) {
		if r.Context().Err() != nil && errors.Is(err, context.Canceled) {
			t.Log.InfoContext(r.Context(), "client closed request", "method", r.Method, "path", r.URL.Path, "status", StatusClientClosed)
			return
		}
		he = Wrap(http.StatusInternalServerError, contract.ErrTypeInternal, "internal error", err)
	}
	level := slog.LevelInfo
	if he.Status >= 500 {
		level = slog.LevelError
	}
	msg := t.LogMsg
	if msg == "" {
		msg = "request failed"
	}
	t.Log.Log(r.Context(), level, msg, "method", r.Method, "path", r.URL.Path, "status", he.Status, "type", he.Type, "err", err)
	t.body()(w, r, he)
}

// Handle adapts h to an http.Handler that writes errors with WriteError.
func Handle(log *slog.Logger, h HandlerFunc) http.Handler { return Platform(log).Handle(h) }

// WriteError is Platform(log).Write: it logs err once and answers with its
// status and a contract.ErrorBody.
func WriteError(log *slog.Logger, w http.ResponseWriter, r *http.Request, err error) {
	Platform(log).Write(w, r, err)
}

func setHeaders(w http.ResponseWriter, e *Error) {
	for k, vs := range e.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
}

// PlatformBody is the ErrorBody of the platform's JSON APIs (browser,
// worker, mint, reports): contract.ErrorBody,
//
//	{"error":{"type":"not_found","message":"...","request_id":"req_..."}}
//
// e.Details is not sent.
func PlatformBody(w http.ResponseWriter, r *http.Request, e *Error) {
	setHeaders(w, e)
	WriteJSON(w, e.Status, contract.ErrorBody{Error: contract.ErrorDetail{Type: e.Type, Message: e.Msg, RequestID: RequestID(r.Context())}})
}

// AnthropicBody is the ErrorBody of the Anthropic-family routes (the
// gateway-proxy, the worker's local proxy): Anthropic's error envelope,
//
//	{"type":"error","error":{"type":"rate_limit_error","message":"... (request req_...)","details":{...}},"request_id":"req_..."}
//
// with the id also in the request-id header. The id ends the message too:
// Claude Code shows only the message (its "API Error: …" text, which
// becomes the browser's turn_failed), and the id is what finds the call in
// the worker's and the control plane's logs. A platform error type is
// mapped to Anthropic's by e.Status (AnthropicType).
func AnthropicBody(w http.ResponseWriter, r *http.Request, e *Error) {
	setHeaders(w, e)
	id := RequestID(r.Context())
	msg := e.Msg
	if id != "" {
		w.Header().Set("request-id", id)
		msg = NamedMessage(msg, id)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(anthropic.ErrorEnvelope{
		Type:      "error",
		Error:     anthropic.ErrorDetail{Type: AnthropicType(e.Status, e.Type), Message: msg, Details: e.Details},
		RequestID: id,
	})
}

// NamedMessage is msg ending with " (request <id>)", as every error in
// Anthropic's envelope is answered (AnthropicBody; the gateway names an
// upstream's errors too): msg itself when it already ends so.
func NamedMessage(msg, id string) string {
	if suffix := " (request " + id + ")"; !strings.HasSuffix(msg, suffix) {
		return msg + suffix
	}
	return msg
}

// AnthropicType is typ when it is one of Anthropic's error types, else the
// type Anthropic uses for status (invalid_request_error for other 4xx,
// api_error for other 5xx).
func AnthropicType(status int, typ string) string {
	if typ == anthropic.ErrInvalidRequest || typ == anthropic.ErrAPI {
		return typ
	}
	for _, t := range anthropicTypeByStatus {
		if typ == t {
			return typ
		}
	}
	if t, ok := anthropicTypeByStatus[status]; ok {
		return t
	}
	if status >= 500 {
		return anthropic.ErrAPI
	}
	return anthropic.ErrInvalidRequest
}

// anthropicTypeByStatus is the Anthropic error type of each status that
// has one of its own (Anthropic API errors documentation).
var anthropicTypeByStatus = map[int]string{
	http.StatusUnauthorized:          anthropic.ErrAuthentication,
	http.StatusPaymentRequired:       anthropic.ErrBilling,
	http.StatusForbidden:             anthropic.ErrPermission,
	http.StatusNotFound:              anthropic.ErrNotFound,
	http.StatusRequestEntityTooLarge: anthropic.ErrTooLarge,
	http.StatusTooManyRequests:       anthropic.ErrRateLimit,
	http.StatusGatewayTimeout:        anthropic.ErrTimeout,
	529:                              anthropic.ErrOverloaded,
}

// WriteJSON writes v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v) // the client may be gone; nothing to do about it
}

// DefaultMaxBody bounds JSON request bodies (1 MiB).
const DefaultMaxBody = 1 << 20

// ReadBody reads the whole request body, at most max bytes. Larger bodies
// give a 413 *Error.
func ReadBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, Errorf(http.StatusRequestEntityTooLarge, contract.ErrTypeTooLarge, "request body over %d bytes", max)
		}
		return nil, Wrap(http.StatusBadRequest, contract.ErrTypeInvalidRequest, "read request body", err)
	}
	return body, nil
}

// DecodeJSON unmarshals body into v, refusing unknown fields, trailing data
// and a Content-Type other than application/json (when one is set). Errors
// are 400/415 *Error values naming the problem.
func DecodeJSON(r *http.Request, body []byte, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return Errorf(http.StatusUnsupportedMediaType, contract.ErrTypeUnsupported, "content type %q: want application/json", ct)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Wrap(http.StatusBadRequest, contract.ErrTypeInvalidRequest, "malformed JSON body: "+jsonProblem(err), err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return BadRequest("malformed JSON body: trailing data after the object")
	}
	return nil
}

// jsonProblem says what is wrong with a JSON body in the client's terms
// (field names as the body spells them, JSON kinds), not in Go's: no Go type
// or struct names.
func jsonProblem(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return "empty body"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected end of the body"
	case errors.As(err, &syn):
		return fmt.Sprintf("invalid JSON at byte %d", syn.Offset)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return fmt.Sprintf("the body is a JSON %s, want %s", typ.Value, jsonKind(typ.Type))
		}
		return fmt.Sprintf("field %q is a JSON %s, want %s", typ.Field, typ.Value, jsonKind(typ.Type))
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return "unknown field " + f
	}
	return "not a valid JSON object of this request"
}

// jsonKind is the JSON kind a Go type is decoded from.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "another value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "another value"
}

// NewServer returns an http.Server with the platform's hardening: bounded
// header read time and size, idle timeout, and a BaseContext derived from
// ctx. It sets no WriteTimeout: the servers stream SSE and proxied model
// responses that legitimately last many minutes; handlers bound their own work.
func NewServer(ctx context.Context, addr string, h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// Serve runs srv on ln until ctx ends, then shuts it down gracefully within
// grace. It returns nil after a clean shutdown.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		_ = srv.Close()
	}
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return serr
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return nil // streams were cut at the end of the grace period
	}
	return err
}

// JoinURL returns base with elem joined to its path, always with a leading
// slash. (url.URL.JoinPath leaves the path of a base without one relative,
// "api/x", which net/http then sends as an invalid request line.)
func JoinURL(base *url.URL, elem ...string) *url.URL {
	u := base.JoinPath(elem...)
	if !strings.HasPrefix(u.Path, "/") {
		u.Path = "/" + u.Path
		if u.RawPath != "" {
			u.RawPath = "/" + u.RawPath
		}
	}
	return u
}

// Routes wraps mux so that requests no pattern matches get the JSON error
// shape: 404 not_found, or 405 method_not_allowed with the Allow header when
// the path exists for other methods.
//
// It also turns a handler's panic into a 500 in that shape (when nothing was
// written yet) with one error log line holding the stack, and logs each
// request once it is answered: method, path, status and duration, at debug
// level for a successful GET, else at info (with the request id, when the
// logger is WithRequestIDs').
func Routes(mux *http.ServeMux, log *slog.Logger) http.Handler {
	return Platform(log).Routes(mux)
}

// Routes is the package's Routes with t's error path: unknown paths, wrong
// methods and panics answer in t's family's shape.
func (t Translator) Routes(mux *http.ServeMux) http.Handler {
	return logRequests(t.Log, t.Recover(t.routes(mux)))
}

func (t Translator) routes(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		// Ask the mux's own fallback which status it means, without letting
		// it write its plain-text body.
		probe := &statusProbe{header: http.Header{}}
		h.ServeHTTP(probe, r)
		if probe.status == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", probe.header.Get("Allow"))
			t.Write(w, r, Errorf(http.StatusMethodNotAllowed, contract.ErrTypeMethod, "method %s not allowed on %s", r.Method, r.URL.Path))
			return
		}
		if probe.status >= 300 && probe.status < 400 {
			// A redirect the mux computed (e.g. a cleaned path): keep it.
			for k, v := range probe.header {
				w.Header()[k] = v
			}
			w.WriteHeader(probe.status)
			return
		}
		t.Write(w, r, NotFound("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
}

// statusProbe records a handler's status and headers and discards its body.
type statusProbe struct {
	header http.Header
	status int
}

func (p *statusProbe) Header() http.Header { return p.header }
func (p *statusProbe) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	return len(b), nil
}
func (p *statusProbe) WriteHeader(status int) {
	if p.status == 0 {
		p.status = status
	}
}

// BearerToken returns the credential of an "Authorization: Bearer <token>"
// header (the scheme is case-insensitive, RFC 9110 §11.1), or "" when there
// is none.
func BearerToken(r *http.Request) string {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}
