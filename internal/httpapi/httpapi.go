// Package httpapi holds the HTTP plumbing every TalkIDE server shares:
// handlers that return errors, the one translator that logs an error once and
// answers in the documented JSON shape (contract.ErrorBody), bounded JSON
// request decoding, and hardened http.Server settings.
//
// Main types: Error (a safe client message kept apart from the logged cause),
// HandlerFunc (an http handler that returns an error) and Server settings via
// NewServer. It does not route, authenticate or know any endpoint.
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
	"strings"
	"time"

	"github.com/talkide/talkide/internal/contract"
)

// Error is an error with the HTTP status and the message a client may see.
// Err, the cause, is logged but never sent.
type Error struct {
	Status int
	// Type is one of the contract.ErrType* values.
	Type string
	// Msg is safe to show to the client.
	Msg string
	// Err is the cause, for the log.
	Err error
	// Header holds extra response headers (e.g. Retry-After).
	Header http.Header
}

func (e *Error) Error() string {
	if e.Err != nil {
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

// Handle adapts h to an http.Handler that writes errors with WriteError.
func Handle(log *slog.Logger, h HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			WriteError(log, w, r, err)
		}
	})
}

// WriteError logs err once and answers with its status and a
// contract.ErrorBody. Errors that are not *Error become 500 with a generic
// message; a cancelled request context is logged as 499 and not answered.
func WriteError(log *slog.Logger, w http.ResponseWriter, r *http.Request, err error) {
	var he *Error
	if !errors.As(err, &he) {
		if r.Context().Err() != nil && errors.Is(err, context.Canceled) {
			log.Info("client closed request", "method", r.Method, "path", r.URL.Path, "status", StatusClientClosed)
			return
		}
		he = Wrap(http.StatusInternalServerError, contract.ErrTypeInternal, "internal error", err)
	}
	level := slog.LevelInfo
	if he.Status >= 500 {
		level = slog.LevelError
	}
	log.Log(r.Context(), level, "request failed", "method", r.Method, "path", r.URL.Path, "status", he.Status, "type", he.Type, "err", err)
	for k, vs := range he.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	WriteJSON(w, he.Status, contract.ErrorBody{Error: contract.ErrorDetail{Type: he.Type, Message: he.Msg, RequestID: RequestID(r.Context())}})
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
		return Wrap(http.StatusBadRequest, contract.ErrTypeInvalidRequest, "malformed JSON body: "+err.Error(), err)
	}
	if dec.More() {
		return BadRequest("malformed JSON body: trailing data after the object")
	}
	return nil
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
	return logRequests(log, recoverPanics(log, routes(mux, log)))
}

func routes(mux *http.ServeMux, log *slog.Logger) http.Handler {
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
			WriteError(log, w, r, Errorf(http.StatusMethodNotAllowed, contract.ErrTypeMethod, "method %s not allowed on %s", r.Method, r.URL.Path))
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
		WriteError(log, w, r, NotFound("no such endpoint: %s %s", r.Method, r.URL.Path))
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
