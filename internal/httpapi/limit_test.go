package httpapi

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestLimitListenerRefusesBeyondItsLimit keeps two connections open on a
// listener limited to two: the third gets a 503 with Retry-After in both
// error shapes and is closed; once one closes, a new one is served again.
func TestLimitListenerRefusesBeyondItsLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := LimitListener(ln, 2, "at the limit")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	get := func(c net.Conn) *http.Response {
		t.Helper()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	var conns []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	for i, c := range conns[:2] {
		if resp := get(c); resp.StatusCode != http.StatusOK {
			t.Fatalf("connection %d: got %d, want 200", i+1, resp.StatusCode)
		}
	}
	resp := get(conns[2])
	var body struct {
		Type  string
		Error struct{ Type, Message string }
	}
	json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || body.Type != "error" ||
		body.Error.Type != "unavailable" || !strings.Contains(body.Error.Message, "at the limit") {
		t.Fatalf("third connection: got %d %q %+v, want 503 with Retry-After and the message", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if got := l.Refused(); got != 1 {
		t.Errorf("Refused: got %d, want 1", got)
	}
	conns[0].Close()
	for l.Open() >= 2 {
		// The server notices the close on its next read: wait for it.
		time.Sleep(time.Millisecond)
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if resp := get(c); resp.StatusCode != http.StatusOK {
		t.Errorf("after a connection closed: got %d, want 200", resp.StatusCode)
	}
}
