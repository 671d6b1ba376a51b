package controlplane

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
)

// TestStreamThatCannotReachItsWorkerIsAnError guards the exhaustion case of
// issue 10 item 9: a browser stream whose worker connection failed because
// the control plane was out of open files was answered 200 and looked
// healthy with nothing behind it. The test lowers this process's
// RLIMIT_NOFILE to the files it has open, so the control plane can still
// answer on the browser's open connection but cannot dial the worker: the
// stream must be a 503 with Retry-After.
func TestStreamThatCannotReachItsWorkerIsAnError(t *testing.T) {
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, ": fake worker\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(worker.Close)
	f := startControlPlaneWith(t, func(c *Config) { c.WorkerURLTemplate = worker.URL })
	db := f.db
	ctx := t.Context()
	if err := db.UpsertUser(ctx, controlstore.User{ID: "alice", TokenHash: controlstore.HashUserToken("tk_alice")}, [2]string{"acme", "dev"}); err != nil {
		t.Fatal(err)
	}
	conv := controlstore.Conversation{ID: "conv-1", Tenant: "acme", Env: "dev", UserID: "alice", CreatedAt: time.Now().UTC()}
	if err := db.CreateConversation(ctx, conv); err != nil {
		t.Fatal(err)
	}

	// One keep-alive connection to the control plane, opened (and the
	// database connection the handler uses warmed) before the limit drops.
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	get := func(path string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", f.url+path, nil)
		req.Header.Set("Authorization", "Bearer tk_alice")
		return client.Do(req)
	}
	resp, err := get("/api/conversations/conv-1/interrupt") // 405, after nothing: opens the connection
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	var saved syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &saved); err != nil {
		t.Fatal(err)
	}
	// RLIMIT_NOFILE bounds descriptor numbers: fill the holes below the
	// highest one in use, then allow none above it.
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot list open files: %v", err)
	}
	top := 0
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			top = max(top, n)
		}
	}
	var fillers []*os.File
	defer func() {
		for _, f := range fillers {
			f.Close()
		}
	}()
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		fillers = append(fillers, f)
		if int(f.Fd()) >= top {
			top = int(f.Fd())
			break
		}
	}
	low := saved
	low.Cur = uint64(top + 1)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	resp, err = get("/api/conversations/conv-1/stream")
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &saved); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("stream with no connection to its worker: got 200 %s, want 503 with Retry-After", resp.Header.Get("Content-Type"))
	}
	var eb contract.ErrorBody
	json.NewDecoder(resp.Body).Decode(&eb)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || eb.Error.Type != contract.ErrTypeUnavailable ||
		!strings.Contains(eb.Error.Message, "open files") {
		t.Fatalf("got %d (Retry-After %q) %+v, want 503 unavailable with Retry-After saying the control plane is out of open files",
			resp.StatusCode, resp.Header.Get("Retry-After"), eb)
	}
}
