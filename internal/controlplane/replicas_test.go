package controlplane

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/sse"
)

// replicaSet is control-plane replicas sharing one database behind a plain
// round-robin proxy without stickiness, as a Kubernetes Service spreads
// connections over the ready endpoints: a replica is taken out of the
// rotation before it shuts down (its readiness fails first).
type replicaSet struct {
	t     *testing.T
	cfg   Config
	db    *controlstore.DB
	proxy *httptest.Server
	next  atomic.Uint64

	mu   sync.Mutex
	live []*replica // in the rotation; guarded by mu
}

type replica struct {
	s     *Server
	srv   *httptest.Server
	spend *spendParts
	url   *url.URL
}

func newReplicaSet(t *testing.T, workerURL string, n int) *replicaSet {
	t.Helper()
	cfg, db := testConfig(t, func(c *Config) { c.WorkerURLTemplate = workerURL })
	rs := &replicaSet{t: t, cfg: cfg, db: db}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			rs.mu.Lock()
			target := rs.live[int(rs.next.Add(1))%len(rs.live)].url
			rs.mu.Unlock()
			r.SetURL(target)
		},
		ErrorLog: nil,
	}
	rs.proxy = httptest.NewServer(rp)
	for range n {
		rs.live = append(rs.live, rs.start())
	}
	t.Cleanup(func() {
		rs.proxy.Close()
		rs.mu.Lock()
		live := rs.live
		rs.mu.Unlock()
		for _, r := range live {
			r.stop()
		}
		db.Close()
	})
	if err := db.UpsertUser(t.Context(), controlstore.User{ID: "alice", TokenHash: controlstore.HashUserToken("tk_alice")}, [2]string{"acme", "dev"}); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateConversation(t.Context(), controlstore.Conversation{ID: "conv-1", Tenant: "acme", Env: "dev", UserID: "alice", CreatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	return rs
}

// start starts a replica on the shared database.
func (rs *replicaSet) start() *replica {
	spend := newSpendParts(rs.cfg, rs.db)
	s, _ := NewServer(rs.cfg, rs.db, spend)
	srv := httptest.NewServer(s)
	u, _ := url.Parse(srv.URL)
	return &replica{s: s, srv: srv, spend: spend, url: u}
}

// stop shuts r down as Run does on SIGTERM: streams end with a comment,
// then the server closes.
func (r *replica) stop() {
	r.s.BeginShutdown()
	r.srv.Close()
	r.spend.close()
}

// restart replaces replica i with a new one: out of the rotation, shut
// down, then a new one in.
func (rs *replicaSet) restart(i int) {
	rs.mu.Lock()
	old := rs.live[i]
	rs.live = append(rs.live[:i:i], rs.live[i+1:]...)
	rs.mu.Unlock()
	old.stop()
	nu := rs.start()
	rs.mu.Lock()
	rs.live = append(rs.live, nu)
	rs.mu.Unlock()
}

// resumingBrowser follows conv-1 through url as EventSource does: when the
// stream ends or cannot be opened it reconnects with the id of the last
// event it got, until ctx ends. It records every id.
type resumingBrowser struct {
	mu    sync.Mutex
	ids   []int64
	opens int
}

func (b *resumingBrowser) follow(ctx context.Context, base string) {
	var last int64
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/api/conversations/conv-1/stream", nil)
		req.Header.Set("Authorization", "Bearer tk_alice")
		if last > 0 {
			req.Header.Set(contract.HeaderLastEventID, strconv.FormatInt(last, 10))
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil && resp.StatusCode == http.StatusOK {
			b.mu.Lock()
			b.opens++
			b.mu.Unlock()
			r := sse.NewReader(resp.Body)
			for {
				e, err := r.Next()
				if err != nil {
					break
				}
				id, _ := strconv.ParseInt(e.ID, 10, 64)
				last = id
				b.mu.Lock()
				b.ids = append(b.ids, id)
				b.mu.Unlock()
			}
		}
		if resp != nil {
			resp.Body.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (b *resumingBrowser) got() ([]int64, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int64(nil), b.ids...), b.opens
}

// Several control-plane replicas behind a round-robin proxy (issue 28):
// while events keep coming, every replica is restarted in turn, twice
// over, and each browser stream's reconnect lands on whichever replica
// the proxy picks. Every browser gets every event once, in order: no gap
// at a hand-over, no repeat.
func TestRollingRestartOfReplicasLosesNoEvent(t *testing.T) {
	w, workerURL := newEventWorker(t)
	rs := newReplicaSet(t, workerURL, 2)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	browsers := make([]*resumingBrowser, 6)
	var following sync.WaitGroup
	for i := range browsers {
		browsers[i] = &resumingBrowser{}
		following.Go(func() { browsers[i].follow(ctx, rs.proxy.URL) })
	}
	const total = 600
	var appending sync.WaitGroup
	appending.Go(func() {
		for range total / 3 {
			w.append(3)
			time.Sleep(5 * time.Millisecond)
		}
	})
	for round := range 4 {
		time.Sleep(150 * time.Millisecond)
		rs.restart(round % 2)
	}
	appending.Wait()
	deadline := time.Now().Add(60 * time.Second)
	for _, b := range browsers {
		for ids, _ := b.got(); len(ids) < total && time.Now().Before(deadline); ids, _ = b.got() {
			time.Sleep(20 * time.Millisecond)
		}
	}
	cancel()
	following.Wait()
	for i, b := range browsers {
		ids, opens := b.got()
		if opens < 2 {
			t.Errorf("browser %d opened its stream %d times: the restarts never moved it", i, opens)
		}
		checkSeq(t, ids, 0, total)
		t.Logf("browser %d: %d events over %d streams", i, len(ids), opens)
	}
}
