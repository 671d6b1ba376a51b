package sse

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// Conn writes an event stream straight to a connection taken over from the
// HTTP server (Hijack). A stream served by net/http holds, for as long as
// it is open, the server's goroutine for the connection, its read and
// write buffers (about 10 KB) and the request; one taken over holds only
// the socket, so a process can keep tens of thousands of streams open. The
// body is delimited by the connection's end (HTTP/1.1 "Connection:
// close"), which EventSource and every HTTP client read as the stream
// ending. Each write has a deadline: a reader that takes none of the
// stream for that long is cut.
type Conn struct {
	c       net.Conn
	timeout time.Duration
	ctx     context.Context
	cancel  context.CancelFunc
	unwatch func()
	closed  sync.Once
}

// ErrCannotHijack is returned by Hijack when the response cannot be taken
// over (HTTP/2, a writer that does not support it, or headers already
// sent); the caller keeps serving with Writer.
var ErrCannotHijack = errors.New("sse: the response cannot be taken over")

// Hijack takes the connection of an HTTP/1.x GET request over from the server
// and writes a 200 response head with the text/event-stream headers of
// NewWriter, the headers already set on w (a request id, say) and
// "Connection: close". timeout bounds each later write. After Hijack the
// handler may return: the stream lives until Close, and its Context
// (carrying r's values) ends when the reader hangs up. The error is
// ErrCannotHijack (nothing was written; w is still usable) or the
// connection's.
func Hijack(w http.ResponseWriter, r *http.Request, timeout time.Duration) (*Conn, error) {
	if r.ProtoMajor != 1 || r.Method != http.MethodGet {
		return nil, ErrCannotHijack // a HEAD gets its head from net/http, with no body
	}
	c, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, errors.Join(ErrCannotHijack, err)
	}
	var b strings.Builder
	b.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\nConnection: close\r\n")
	keys := make([]string, 0, len(w.Header()))
	for k := range w.Header() {
		switch http.CanonicalHeaderKey(k) {
		case "Content-Type", "Cache-Control", "X-Accel-Buffering", "Connection", "Content-Length", "Transfer-Encoding":
			continue
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range w.Header()[k] {
			if strings.ContainsAny(k+v, "\r\n") {
				continue
			}
			b.WriteString(k + ": " + v + "\r\n")
		}
	}
	b.WriteString("\r\n")
	s := &Conn{c: c, timeout: timeout}
	if err := s.write([]byte(b.String())); err != nil {
		c.Close()
		return nil, err
	}
	// The request's values (its id) stay; its end, which net/http
	// signals when the handler returns, does not.
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(r.Context()))
	s.unwatch = watchHangup(c, s.cancel)
	return s, nil
}

func (s *Conn) write(b []byte) error {
	s.c.SetWriteDeadline(time.Now().Add(s.timeout))
	_, err := s.c.Write(b)
	return err
}

// WriteFrames writes frames made by Frame or JSONFrame with one write: a stream catching up sends
// them together, not one system call each.
func (s *Conn) WriteFrames(frames [][]byte) error {
	if len(frames) == 1 {
		return s.write(frames[0])
	}
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	b := make([]byte, 0, n) // not kept: an idle stream holds no buffer
	for _, f := range frames {
		b = append(b, f...)
	}
	return s.write(b)
}

// WriteComment writes a comment line (": text"), as Writer does.
func (s *Conn) WriteComment(text string) error {
	return s.write([]byte(": " + strings.ReplaceAll(text, "\n", " ") + "\n\n"))
}

// Context ends when the reader hangs up (it closed the connection) or the
// stream is closed; off Linux only Close ends it (a failed write tells of
// a reader gone). A stream held without a goroutine reading it learns of
// a closed browser here, at once, not at its next heartbeat.
func (s *Conn) Context() context.Context { return s.ctx }

// Close ends the stream. It is idempotent.
func (s *Conn) Close() error {
	err := net.ErrClosed
	s.closed.Do(func() {
		s.unwatch()
		s.cancel()
		err = s.c.Close()
	})
	return err
}
