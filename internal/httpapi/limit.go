package httpapi

import (
	"bufio"
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
	body := fmt.Sprintf(`{"type":"error","error":{"type":"unavailable","message":%q}}`+"\n", msg)
	return &Limited{Listener: ln, max: int64(max), refusing: make(chan struct{}, maxRefusing),
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

// Limited is a listener made by LimitListener.
type Limited struct {
	net.Listener
	max      int64
	open     atomic.Int64
	refused  atomic.Int64
	refusing chan struct{}
	refusal  []byte
}

// Open returns the number of accepted connections not yet closed.
func (l *Limited) Open() int64 { return l.open.Load() }

// Refused returns the number of connections refused so far.
func (l *Limited) Refused() int64 { return l.refused.Load() }

// Accept waits for a connection within the limit, refusing those beyond it.
func (l *Limited) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			return &countedConn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		l.refused.Add(1)
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

// countedConn gives its slot back when closed.
type countedConn struct {
	net.Conn
	l    *Limited
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
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
