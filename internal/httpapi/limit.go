package httpapi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// LimitListener returns a listener that keeps at most max accepted
// connections open at once, so a server stays below its open-files limit
// and keeps answering instead of stalling on EMFILE. A connection accepted
// beyond max gets an HTTP 503 with Retry-After and msg, in a body that is
// both the platform's error shape and Anthropic's error envelope
// ({"type":"error","error":{"type":"unavailable","message":msg}}), and is
// closed. At most maxRefusing such answers are written at once (each holds
// its connection for up to refuseTimeout); connections beyond that are
// closed unanswered. Open reports the connections currently open.
func LimitListener(ln net.Listener, max int, msg string) *Limited {
	return LimitListenerFiles(ln, NewFiles(max), msg)
}

// LimitListenerFiles is LimitListener with the connections counted in
// files, a budget the process shares with what else holds files (the
// sockets it dials: Files.DialContext): a connection is accepted only
// while files has room.
func LimitListenerFiles(ln net.Listener, files *Files, msg string) *Limited {
	body := fmt.Sprintf(`{"type":"error","error":{"type":"unavailable","message":%q}}`+"\n", msg)
	return &Limited{Listener: ln, files: files, refusing: make(chan struct{}, maxRefusing),
		refusal: []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: " + strconv.Itoa(refuseRetryAfter) +
			"\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)}
}

const (
	// maxRefusing bounds the connections being refused at once.
	maxRefusing = 8
	// refuseTimeout bounds how long a refused connection is read and
	// written.
	refuseTimeout = 2 * time.Second
	// refuseRetryAfter is the Retry-After of a refused connection, in
	// seconds.
	refuseRetryAfter = 2
)

// Files is a budget of open files (sockets, mostly) shared by the parts of
// a process that hold them: the accepted connections of a Limited
// listener and the connections dialled through DialContext. What would
// take the process past it is refused at once, as a clean error, instead
// of failing wherever the next file happens to be opened (EMFILE). It is
// safe for concurrent use.
type Files struct {
	max  atomic.Int64
	open atomic.Int64
}

// NewFiles returns a budget of max open files.
func NewFiles(max int) *Files {
	f := &Files{}
	f.max.Store(int64(max))
	return f
}

// SetMax changes the budget (a process that learns its limit after its
// parts were made).
func (f *Files) SetMax(max int) { f.max.Store(int64(max)) }

// ErrNoFiles is returned by Files.DialContext when the budget is spent; it
// wraps syscall.EMFILE, so it reads as this process's own exhaustion.
var ErrNoFiles = fmt.Errorf("open-files budget spent: %w", syscall.EMFILE)

// TryAcquire takes one file from the budget, reporting whether there was
// room.
func (f *Files) TryAcquire() bool {
	if f.open.Add(1) <= f.max.Load() {
		return true
	}
	f.open.Add(-1)
	return false
}

// Release gives one file back.
func (f *Files) Release() { f.open.Add(-1) }

// Open returns the files taken now.
func (f *Files) Open() int64 { return f.open.Load() }

// LocalExhaustion reports whether err is this process running out of a
// resource (open files, its budget of them included, socket buffers,
// memory) rather than the far side failing.
func LocalExhaustion(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// DialContext returns d.DialContext counted in f: a dial without room
// fails with ErrNoFiles before opening anything, and the connection gives
// its file back when closed.
func (f *Files) DialContext(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if !f.TryAcquire() {
			return nil, &net.OpError{Op: "dial", Net: network, Err: ErrNoFiles}
		}
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			f.Release()
			return nil, err
		}
		return &countedConn{Conn: c, files: f}, nil
	}
}

// Limited is a listener made by LimitListener.
type Limited struct {
	net.Listener
	files    *Files
	refused  atomic.Int64
	refusing chan struct{}
	refusal  []byte
	// full, when set (ShedIdleWhenFull), runs when a connection is
	// refused, at most every 100 ms; lastFull is when it last ran (Unix
	// nanoseconds).
	full     func()
	lastFull atomic.Int64
}

// ShedIdleWhenFull has l close srv's idle keep-alive connections whenever
// it refuses one for want of files (at most every 100 ms), so a budget
// spent on idle connections is given back to those that have work: the
// refused client's retry finds room. Streams taken over from srv are not
// touched.
func (l *Limited) ShedIdleWhenFull(srv *http.Server) {
	l.full = func() {
		srv.SetKeepAlivesEnabled(false) // closes the idle connections
		srv.SetKeepAlivesEnabled(true)
	}
}

// Open returns the files taken from the listener's budget: its accepted
// connections not yet closed, and what else shares the budget.
func (l *Limited) Open() int64 { return l.files.Open() }

// Refused returns the number of connections refused so far.
func (l *Limited) Refused() int64 { return l.refused.Load() }

// Accept waits for a connection within the limit, refusing those beyond it.
func (l *Limited) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.files.TryAcquire() {
			return &countedConn{Conn: c, files: l.files}, nil
		}
		l.refused.Add(1)
		if now, last := time.Now().UnixNano(), l.lastFull.Load(); l.full != nil && now-last > int64(100*time.Millisecond) && l.lastFull.CompareAndSwap(last, now) {
			go l.full()
		}
		select {
		case l.refusing <- struct{}{}:
			go func() {
				defer func() { <-l.refusing }()
				l.refuse(c)
			}()
		default:
			c.Close()
		}
	}
}

// refuse reads the request head (so closing does not reset the
// connection under the client before it reads the answer), answers 503
// and closes c.
func (l *Limited) refuse(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(refuseTimeout))
	if req, err := http.ReadRequest(bufio.NewReaderSize(c, 4<<10)); err == nil {
		req.Body.Close()
	}
	_, _ = c.Write(l.refusal)
}

// countedConn gives its file back to the budget when closed.
type countedConn struct {
	net.Conn
	files *Files
	once  sync.Once
}

// SyscallConn gives the socket under c (a stream taken over from the
// server watches it for the peer's hangup: sse.Conn).
func (c *countedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

func (c *countedConn) Close() error {
	c.once.Do(c.files.Release)
	return c.Conn.Close()
}

// OpenFilesLimit returns the process's open-files limit (RLIMIT_NOFILE's
// soft limit, which Go raises to the hard one at start), at most 1<<20.
func OpenFilesLimit() int {
	var rl syscall.Rlimit
	limit := 1 << 20
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < uint64(limit) {
		limit = int(rl.Cur)
	}
	return limit
}

// OpenFiles counts the process's open files from /proc/self/fd: limit when
// even that cannot be opened for want of descriptors, and ok false when
// there is no /proc.
func OpenFiles(limit int) (n int, ok bool) {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
			return limit, true
		}
		return 0, false
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	return len(names) - 1, true // not the directory itself
}
