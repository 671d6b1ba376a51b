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

// recordingWriter remembers the status a handler answered. It passes
// Flush, Hijack and Unwrap through (SSE streams and proxies need them).
type recordingWriter struct {
	http.ResponseWriter
	status int
}

func (w *recordingWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recordingWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *recordingWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *recordingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *recordingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func recorder(w http.ResponseWriter) *recordingWriter {
	if rw, ok := w.(*recordingWriter); ok {
		return rw
	}
	return &recordingWriter{ResponseWriter: w}
}

// recoverPanics answers a handler's panic with a 500 (unless the answer
// had begun: then the connection is cut, as net/http does) and logs it once
// with its stack. http.ErrAbortHandler passes through untouched.
func recoverPanics(log *slog.Logger, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rw := recorder(w)
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				panic(v)
			}
			log.ErrorContext(r.Context(), "handler panicked", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if rw.status != 0 {
				panic(http.ErrAbortHandler) // the answer had begun: cut it
			}
			WriteJSON(rw, http.StatusInternalServerError, contract.ErrorBody{Error: contract.ErrorDetail{
				Type: contract.ErrTypeInternal, Message: "internal error", RequestID: RequestID(r.Context())}})
		}()
		h.ServeHTTP(rw, r)
	})
}

// logRequests logs each request once answered (see Routes).
func logRequests(log *slog.Logger, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rw := recorder(w)
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
