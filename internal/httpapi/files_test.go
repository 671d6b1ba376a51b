package httpapi

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// TestFilesAreSharedByAcceptsAndDials: a budget of three files taken by
// two accepted connections and one dialled socket refuses the next dial
// with an error that reads as EMFILE and answers the next connection 503;
// each closed socket gives its file back (issue 28: browser streams, the
// feeds' sockets to workers and model calls share one budget).
func TestFilesAreSharedByAcceptsAndDials(t *testing.T) {
	files := NewFiles(3)
	ln := servedWithin(t, files, false)
	status := func(c net.Conn) int { return statusOf(t, c) }
	dial := files.DialContext(&net.Dialer{Timeout: time.Second})
	var accepted []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if got := status(c); got != http.StatusOK {
			t.Fatalf("accepted connection: %d", got)
		}
		accepted = append(accepted, c)
	}
	out, err := dial(t.Context(), "tcp", ln.Addr().String()) // the third file: this dial's own socket
	if err != nil {
		t.Fatal(err)
	}
	if got := files.Open(); got < 3 {
		t.Fatalf("open: %d, want 3", got)
	}
	if _, err := dial(t.Context(), "tcp", ln.Addr().String()); !errors.Is(err, syscall.EMFILE) || !errors.Is(err, ErrNoFiles) {
		t.Fatalf("dial past the budget: %v, want ErrNoFiles (EMFILE)", err)
	}
	// out's peer, accepted beyond the budget, was answered 503.
	if got := status(out); got != http.StatusServiceUnavailable {
		t.Fatalf("connection past the budget: %d, want 503", got)
	}
	out.Close()
	accepted[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for files.Open() > 1 {
		if time.Now().After(deadline) {
			t.Fatalf("open after closing: %d, want 1", files.Open())
		}
		time.Sleep(5 * time.Millisecond)
	}
	again, err := dial(t.Context(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial after closing: %v", err)
	}
	defer again.Close()
	if got := status(again); got != http.StatusOK {
		t.Fatalf("after closing: %d, want 200", got)
	}
}

// A budget spent on idle keep-alive connections is given back to a client
// with work: the connection refused for want of files makes the server
// close its idle ones, and the client's retry is served. Found by a
// review: a control plane whose streams left only their headroom could
// have that headroom held by browsers' idle API connections, refusing the
// workers' model calls.
func TestIdleConnectionsGiveWayWhenTheBudgetIsSpent(t *testing.T) {
	ln := servedWithin(t, NewFiles(2), true)
	status := func(c net.Conn) int { return statusOf(t, c) }
	for range 2 { // two idle keep-alive connections take the budget
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if got := status(c); got != http.StatusOK {
			t.Fatalf("idle-to-be connection: %d", got)
		}
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if got := status(c); got != http.StatusServiceUnavailable {
		t.Fatalf("past the budget: %d, want 503", got)
	}
	c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		got := status(c)
		c.Close()
		if got == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the retry is still refused (%d): the idle connections kept the budget", got)
		}
		time.Sleep(150 * time.Millisecond)
	}
}

// servedWithin serves "ok" on a listener limited by files (shedding idle
// connections when full, with shed) and returns the listener under it.
func servedWithin(t *testing.T, files *Files, shed bool) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := LimitListenerFiles(ln, files, "at the limit")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
	if shed {
		l.ShedIdleWhenFull(srv)
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return ln
}

// statusOf sends a GET on c and returns the answer's status.
func statusOf(t *testing.T, c net.Conn) int {
	t.Helper()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
