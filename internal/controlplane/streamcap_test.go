package controlplane

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
)

// The open-files budget leaves nearly all of a process's sockets to
// browser streams (issue 28: at least 19,000 at a limit of 20,000). Before,
// streams got a quarter of the limit (4,956 here), since each was counted
// as a connection that may need a second socket, though streams of one
// conversation share one.
func TestFDBudgetLeavesMostSocketsToStreams(t *testing.T) {
	for _, tc := range []struct{ limit, open, atLeast int }{
		{20000, 15, 19000},
		{1 << 20, 40, 1000000},
		{1024, 10, 700},
	} {
		b := newFDBudget(tc.limit, tc.open)
		if b.MaxStreams < tc.atLeast {
			t.Errorf("limit %d: %d streams, want at least %d", tc.limit, b.MaxStreams, tc.atLeast)
		}
		if b.Reserved+b.Sockets > tc.limit {
			t.Errorf("limit %d: reserve %d and sockets %d exceed it", tc.limit, b.Reserved, b.Sockets)
		}
		if room := b.Sockets - b.MaxStreams; room < 64 {
			t.Errorf("limit %d: %d sockets left for model calls and requests, want at least 64", tc.limit, room)
		}
	}
	if b := newFDBudget(100, 20); b.MaxStreams < 1 || b.Sockets-b.MaxStreams < 1 {
		t.Errorf("a tiny limit: %+v", b)
	}
}

// rawStream opens conversation conv's browser stream on a bare
// connection and reads its answer head, so the test holds no goroutine
// for it; it returns the connection and the status.
func rawStream(t *testing.T, base, conv, bearer string) (net.Conn, int) {
	t.Helper()
	return rawRequest(t, base, "GET", "/api/conversations/"+conv+"/stream", bearer)
}

// rawRequest sends method path on a bare connection and reads the
// answer's head (and the body of a refusal).
func rawRequest(t *testing.T, base, method, path, bearer string) (net.Conn, int) {
	t.Helper()
	u, _ := url.Parse(base)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\n\r\n", method, path, u.Host, bearer)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body)
	}
	c.SetReadDeadline(time.Time{})
	return c, resp.StatusCode
}

func waitSlots(t *testing.T, s *Server, want int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.slots.n.Load() != want {
		if time.Now().After(deadline) {
			t.Fatalf("slots taken: %d, want %d", s.slots.n.Load(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Browser streams and the feeds under them share one cap: a stream takes
// a slot and the first of a conversation a second for its feed, refused
// with 503 and Retry-After when they are not free. A browser that hangs
// up gives its slot back at once, not at the next heartbeat (an hour here):
// the stream is held without a goroutine reading it, so its end is seen
// by watching the socket.
func TestStreamsAndFeedsShareTheCap(t *testing.T) {
	f, _ := fanoutFixture(t)
	if err := f.db.CreateConversation(t.Context(), controlstore.Conversation{ID: "conv-2", Tenant: "acme", Env: "dev", UserID: "alice", CreatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	f.s.heartbeat = time.Hour
	f.s.feeds.linger = 50 * time.Millisecond
	f.s.slots.max = 3

	a1, st := rawStream(t, f.url, "conv-1", "tk_alice")
	if st != http.StatusOK {
		t.Fatalf("first stream: %d", st)
	}
	waitSlots(t, f.s, 2) // the stream and conv-1's feed
	a2, st := rawStream(t, f.url, "conv-1", "tk_alice")
	if st != http.StatusOK {
		t.Fatalf("second stream of the same conversation (its feed is open): %d", st)
	}
	waitSlots(t, f.s, 3)
	resp := get(t, f.url+"/api/conversations/conv-2/stream", "tk_alice")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(resp.body, "limit") {
		t.Fatalf("a stream needing a feed with one slot free: %d %q %s, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), resp.body)
	}
	a2.Close()
	waitSlots(t, f.s, 2) // seen at once, with no write
	a1.Close()
	waitSlots(t, f.s, 0) // the feed closes after its linger
	b1, st := rawStream(t, f.url, "conv-2", "tk_alice")
	if st != http.StatusOK {
		t.Fatalf("once free: %d", st)
	}
	b1.Close()
}

type answer struct {
	*http.Response
	body string
}

func get(t *testing.T, u, bearer string) answer {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", u, nil)
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return answer{resp, string(b)}
}

// A browser stream on HTTP/1.1 holds one goroutine of this process (its
// relay), not the HTTP server's connection goroutine, its background read
// and its buffers as well: that is what lets a process keep ~19,000 open
// at about 8 KB each (make bench-fanout). Before, each held two.
func TestBrowserStreamHoldsOneGoroutine(t *testing.T) {
	f, w := fanoutFixture(t)
	w.append(1)
	const n = 200
	runtime.GC()
	before := runtime.NumGoroutine()
	for range n {
		if _, st := rawStream(t, f.url, "conv-1", "tk_alice"); st != http.StatusOK {
			t.Fatalf("stream: %d", st)
		}
	}
	waitSlots(t, f.s, n+1)
	grew := runtime.NumGoroutine() - before
	// The feed and its worker connection add a few.
	if grew > n+10 {
		t.Fatalf("%d streams grew the goroutines by %d, want about %d", n, grew, n)
	}
	t.Logf("%d streams: %d goroutines", n, grew)
}

// A resume point nobody could check (the worker had no session yet, or
// was unreachable) must not seed the conversation's feed: once the worker
// refuses it (beyond its newest event) the stream ends, and the next
// stream from the start is served by a feed at the right place. Before,
// the feed kept retrying the bogus point for as long as it had a viewer,
// and that stream never got an event nor ended.
func TestUncheckedResumePointDoesNotSeedTheFeed(t *testing.T) {
	f, w := fanoutFixture(t)
	w.missing.Store(true)
	bogus := f.openBrowser(t, t.Context(), 50)
	w.missing.Store(false)
	w.append(3)
	select {
	case <-bogus.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("the stream resumed from an unchecked point beyond the newest event is still open, with %d events", len(bogus.got()))
	}
	if got := bogus.got(); len(got) != 0 {
		t.Fatalf("the bogus stream got %v", got)
	}
	fresh := f.openBrowser(t, t.Context(), 0)
	fresh.waitIDs(t, 0, 3)
	if resp := get(t, f.url+"/api/conversations/conv-1/stream?after=50", "tk_alice"); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("resuming beyond the newest event once the worker can say so: %d %s, want 400", resp.StatusCode, resp.body)
	}
}

// A feed keeps its latest frames within a bound of bytes as well as of
// frames: a conversation of large events (tool results of megabytes)
// holds a few megabytes per process, not 512 of them. A stream that joins
// behind what is kept still gets everything (it catches up on its own).
func TestFeedKeepsABoundedNumberOfBytes(t *testing.T) {
	f, w := fanoutFixture(t)
	w.pad = strings.Repeat("x", 200<<10)
	first := f.openBrowser(t, t.Context(), 0)
	w.append(60) // 12 MB
	first.waitIDs(t, 0, 60)
	f.s.feeds.mu.Lock()
	fd := f.s.feeds.byKey["acme/dev/conv-1"]
	f.s.feeds.mu.Unlock()
	fd.mu.RLock()
	kept, bytes := len(fd.ring), fd.ringBytes
	fd.mu.RUnlock()
	if bytes > feedRecentBytes || kept >= 60 {
		t.Fatalf("the feed keeps %d frames, %d bytes: want at most %d bytes", kept, bytes, feedRecentBytes)
	}
	late := f.openBrowser(t, t.Context(), 5)
	late.waitIDs(t, 5, 55)
}

// A stream catching up on its own (behind a feed that has not relayed
// its resume point) gives its slot back as soon as its browser hangs up,
// like any other: found by a review, such a stream held its slot, socket
// and goroutine for as long as the worker sent nothing.
func TestCatchingUpStreamGivesItsSlotBackOnHangup(t *testing.T) {
	f, w := fanoutFixture(t)
	f.s.heartbeat = time.Hour
	w.missing.Store(true) // no session yet: nothing is checked or relayed
	if _, st := rawRequest(t, f.url, "GET", "/api/conversations/conv-1/stream?after=50", "tk_alice"); st != http.StatusOK {
		t.Fatalf("first stream: %d", st)
	}
	waitSlots(t, f.s, 2) // it and the feed at 50
	b, st := rawRequest(t, f.url, "GET", "/api/conversations/conv-1/stream", "tk_alice")
	if st != http.StatusOK {
		t.Fatalf("second stream: %d", st)
	}
	waitSlots(t, f.s, 3) // behind the feed: catching up on its own
	b.Close()
	waitSlots(t, f.s, 2)
}

// HEAD on the stream answers the stream's head and ends: found by a
// review, it was taken over and served the events.
func TestHeadOfTheStreamEnds(t *testing.T) {
	f, w := fanoutFixture(t)
	w.append(2)
	c, st := rawRequest(t, f.url, "HEAD", "/api/conversations/conv-1/stream", "tk_alice")
	if st != http.StatusOK {
		t.Fatalf("HEAD: %d", st)
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if b, _ := io.ReadAll(c); len(b) > 0 {
		t.Fatalf("HEAD answered a body: %q", b)
	}
	waitSlots(t, f.s, 0)
}
