package controlplane

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/sse"
)

// eventWorker is a worker's event stream as the real one serves it: the
// stored events after Last-Event-ID, then each new one as it is appended.
// It counts the streams it serves.
type eventWorker struct {
	mu      sync.Mutex
	events  []contract.Event
	changed chan struct{}
	pad     string // added to each event's data (to make them large)
	// missing makes it answer 404, as a worker with no session for the
	// conversation yet.
	missing atomic.Bool

	opened atomic.Int64
	open   atomic.Int64
}

func newEventWorker(t *testing.T) (*eventWorker, string) {
	w := &eventWorker{changed: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(w.serve))
	t.Cleanup(srv.Close)
	return w, srv.URL
}

func (w *eventWorker) append(n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for range n {
		id := int64(len(w.events) + 1)
		w.events = append(w.events, contract.Event{ID: id, Type: contract.EventAssistantText, ConversationID: "conv-1", Time: time.Now().UTC(),
			Data: []byte(`{"text":"` + strconv.FormatInt(id, 10) + w.pad + `"}`)})
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

func (w *eventWorker) serve(rw http.ResponseWriter, r *http.Request) {
	if !strings.HasSuffix(r.URL.Path, "/events") {
		http.NotFound(rw, r)
		return
	}
	if w.missing.Load() {
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(http.StatusNotFound)
		fmt.Fprint(rw, `{"error":{"type":"not_found","message":"no session for this conversation"}}`)
		return
	}
	w.opened.Add(1)
	w.open.Add(1)
	defer w.open.Add(-1)
	after, _ := strconv.ParseInt(r.Header.Get(contract.HeaderLastEventID), 10, 64)
	w.mu.Lock()
	newest := int64(len(w.events))
	w.mu.Unlock()
	if after > newest {
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(rw, `{"error":{"type":"invalid_request","message":"resume point %d is beyond the newest event %d"}}`, after, newest)
		return
	}
	sw := sse.NewWriter(rw)
	rw.WriteHeader(http.StatusOK)
	sw.WriteComment("worker events") // the headers go out at once
	for {
		w.mu.Lock()
		var next []contract.Event
		if after < int64(len(w.events)) {
			next = w.events[after:]
		}
		changed := w.changed
		w.mu.Unlock()
		for _, ev := range next {
			if err := sw.WriteJSON(strconv.FormatInt(ev.ID, 10), string(ev.Type), ev); err != nil {
				return
			}
			after = ev.ID
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

// browser is one browser stream of conv-1: the ids it got, in order.
type browser struct {
	mu   sync.Mutex
	ids  []int64
	done chan struct{}
	resp *http.Response
}

func (f *cpFixture) openBrowser(t *testing.T, ctx context.Context, after int64) *browser {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", f.url+"/api/conversations/conv-1/stream", nil)
	req.Header.Set("Authorization", "Bearer tk_alice")
	if after > 0 {
		req.Header.Set(contract.HeaderLastEventID, strconv.FormatInt(after, 10))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	b := &browser{done: make(chan struct{}), resp: resp}
	go func() {
		defer close(b.done)
		defer resp.Body.Close()
		r := sse.NewReader(resp.Body)
		for {
			e, err := r.Next()
			if err != nil {
				return
			}
			id, _ := strconv.ParseInt(e.ID, 10, 64)
			b.mu.Lock()
			b.ids = append(b.ids, id)
			b.mu.Unlock()
		}
	}()
	return b
}

func (b *browser) got() []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int64(nil), b.ids...)
}

// waitIDs waits until b has n ids and checks they are from+1..from+n.
func (b *browser) waitIDs(t *testing.T, from int64, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for len(b.got()) < n && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	checkSeq(t, b.got(), from, n)
}

func checkSeq(t *testing.T, ids []int64, from int64, n int) {
	t.Helper()
	if len(ids) != n {
		t.Fatalf("got %d events, want %d (first %v)", len(ids), n, ids[:min(len(ids), 5)])
	}
	for i, id := range ids {
		if id != from+int64(i)+1 {
			t.Fatalf("event %d has id %d, want %d: a gap or a repeat", i, id, from+int64(i)+1)
		}
	}
}

func fanoutFixture(t *testing.T) (*cpFixture, *eventWorker) {
	t.Helper()
	w, url := newEventWorker(t)
	f := startControlPlaneWith(t, func(c *Config) { c.WorkerURLTemplate = url })
	ctx := t.Context()
	if err := f.db.UpsertUser(ctx, controlstore.User{ID: "alice", TokenHash: controlstore.HashUserToken("tk_alice")}, [2]string{"acme", "dev"}); err != nil {
		t.Fatal(err)
	}
	if err := f.db.CreateConversation(ctx, controlstore.Conversation{ID: "conv-1", Tenant: "acme", Env: "dev", UserID: "alice", CreatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	return f, w
}

// Every browser stream of a conversation in one process shares one
// worker subscription (issue 28), and each still gets every event once,
// in order, whether it joined at the start or behind.
func TestBrowserStreamsShareOneWorkerSubscription(t *testing.T) {
	f, w := fanoutFixture(t)
	w.append(10)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const viewers = 40
	var bs []*browser
	for i := range viewers {
		bs = append(bs, f.openBrowser(t, ctx, int64(i%5)))
	}
	w.append(30)
	for i, b := range bs {
		from := int64(i % 5)
		b.waitIDs(t, from, 40-int(from))
	}
	if n := w.opened.Load(); n != 1 {
		t.Fatalf("%d browser streams opened %d worker streams; want 1", viewers, n)
	}
	// The subscription closes a moment after the last stream.
	cancel()
	deadline := time.Now().Add(30 * time.Second)
	for w.open.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := w.open.Load(); n != 0 {
		t.Fatalf("%d worker streams still open after every browser left", n)
	}
}

// A stream that joins behind what the feed keeps catches up on a stream of
// its own, with no gap or repeat at the hand-over, then shares.
func TestBrowserStreamBehindTheFeedCatchesUp(t *testing.T) {
	f, w := fanoutFixture(t)
	ctx := t.Context()
	first := f.openBrowser(t, ctx, 0)
	w.append(3 * feedRecent)
	first.waitIDs(t, 0, 3*feedRecent)
	late := f.openBrowser(t, ctx, 7)
	w.append(50)
	first.waitIDs(t, 0, 3*feedRecent+50)
	late.waitIDs(t, 7, 3*feedRecent+50-7)
	if n := w.opened.Load(); n != 2 {
		t.Fatalf("%d worker streams, want 2 (the feed and one catch-up)", n)
	}
	deadline := time.Now().Add(30 * time.Second)
	for w.open.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := w.open.Load(); n != 1 {
		t.Fatalf("%d worker streams open once the late stream caught up, want 1", n)
	}
}

// A browser that stops reading is cut once it is a whole queue behind,
// with a comment saying why, and the others get every event meanwhile; it
// resumes with Last-Event-ID with no gap or repeat.
func TestSlowBrowserStreamIsCutAndResumes(t *testing.T) {
	f, w := fanoutFixture(t)
	w.pad = strings.Repeat("x", 4000)
	ctx := t.Context()
	fast := f.openBrowser(t, ctx, 0)
	// A browser that reads nothing after its request: its socket buffers
	// fill and the control plane's writes to it block.
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// HTTP/1.0: the body is not chunked, so its lines can be read as
	// they are.
	fmt.Fprintf(conn, "GET /api/conversations/conv-1/stream HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer tk_alice\r\n\r\n")
	time.Sleep(200 * time.Millisecond)
	const n = 8 * feedRecent
	w.append(n)
	fast.waitIDs(t, 0, n)
	// Now read the slow one: what it got, then the cut.
	conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	var ids []int64
	var notes []string
	r := bufio.NewReaderSize(conn, 1<<16)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			break
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case strings.HasPrefix(line, "id: "):
			id, _ := strconv.ParseInt(line[4:], 10, 64)
			ids = append(ids, id)
		case strings.HasPrefix(line, ": "):
			notes = append(notes, line[2:])
		}
		if len(notes) > 0 && strings.Contains(notes[len(notes)-1], "fell too far behind") {
			break
		}
	}
	if len(notes) == 0 || !strings.Contains(notes[len(notes)-1], "fell too far behind") {
		t.Fatalf("the slow stream was not cut (got %d events, comments %q)", len(ids), notes)
	}
	if len(ids) >= n {
		t.Fatalf("the slow stream got all %d events: it was never behind", len(ids))
	}
	checkSeq(t, ids, 0, len(ids))
	resumed := f.openBrowser(t, ctx, ids[len(ids)-1])
	resumed.waitIDs(t, ids[len(ids)-1], n-len(ids))
}

// A resume point beyond the newest event is refused (400, as documented)
// while the conversation's feed is open, as it is without one: the feed
// does not vouch for ids it has not relayed.
func TestResumeBeyondTheNewestEventIsRefusedWithAFeedOpen(t *testing.T) {
	f, w := fanoutFixture(t)
	w.append(5)
	ctx := t.Context()
	open := f.openBrowser(t, ctx, 0)
	open.waitIDs(t, 0, 5)
	for _, after := range []string{"6", "100000"} {
		code, body := f.do(t, "GET", "/api/conversations/conv-1/stream?after="+after, "tk_alice", "")
		if code != http.StatusBadRequest || !strings.Contains(string(body), "beyond the newest") {
			t.Fatalf("resume after %s with a feed open: %d %s; want 400", after, code, body)
		}
	}
	// A resume at the newest event joins the feed and gets what follows.
	late := f.openBrowser(t, ctx, 5)
	w.append(2)
	late.waitIDs(t, 5, 2)
}
