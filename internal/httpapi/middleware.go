package httpapi

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/talkide/talkide/internal/contract"
)

// StatusRecorder remembers the status a handler answered (0 until it
// wrote; 200 for a body or flush without WriteHeader). It passes Flush,
// Hijack and Unwrap through (SSE streams and proxies need them).
type StatusRecorder struct {
	http.ResponseWriter
	status int
}

// Status is the status written so far, 0 when nothing was.
func (w *StatusRecorder) Status() int { return w.status }

// NewStatusRecorder returns w itself when it is a *StatusRecorder, else a
// new one around it.
func NewStatusRecorder(w http.ResponseWriter) *StatusRecorder {
	if rw, ok := w.(*StatusRecorder); ok {
		return rw
	}
	return &StatusRecorder{ResponseWriter: w}
}

func (w *StatusRecorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *StatusRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *StatusRecorder) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *StatusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *StatusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Recover answers a panic of h with a 500 internal error in t's family's
// shape (unless the answer had begun: then the connection is cut, as
// net/http does) and logs it once, with its stack. http.ErrAbortHandler
// passes through untouched.
func (t Translator) Recover(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rw := NewStatusRecorder(w)
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				panic(v)
			}
			t.Log.ErrorContext(r.Context(), "handler panicked", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if rw.status != 0 {
				panic(http.ErrAbortHandler) // the answer had begun: cut it
			}
			t.body()(rw, r, Errorf(http.StatusInternalServerError, contract.ErrTypeInternal, "internal error"))
		}()
		h.ServeHTTP(rw, r)
	})
}

// logRequests logs each request once answered (see Routes).
func logRequests(log *slog.Logger, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rw := NewStatusRecorder(w)
		defer func() {
			status := rw.status
			if status == 0 {
				status = StatusClientClosed
				if r.Context().Err() == nil {
					status = http.StatusOK // answered with no body
				}
			}
			level := slog.LevelInfo
			if (r.Method == http.MethodGet || r.Method == http.MethodHead) && status < 400 {
				level = slog.LevelDebug
			}
			log.Log(r.Context(), level, "request", "method", r.Method, "path", r.URL.Path, "status", status,
				"duration_ms", time.Since(start).Milliseconds())
		}()
		h.ServeHTTP(rw, r)
	})
}
