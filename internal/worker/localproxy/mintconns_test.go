package localproxy_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/worker/localproxy"
)

// TestConcurrentMintsReuseConnections: a worker whose conversations call
// the model at the same time mints at the same time. Each mint must reuse
// a kept-alive connection to the control plane, not open a new one: with
// Go's default of two idle connections per host, 16 concurrent mints in
// each of 10 rounds opened about 140 connections (and left as many sockets
// in TIME_WAIT), each costing a handshake on the way to the model.
func TestConcurrentMintsReuseConnections(t *testing.T) {
	var opened atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * time.Millisecond) // the mint's work, so the calls overlap
		httpapi.WriteJSON(w, http.StatusOK, contract.MintResponse{Token: "wt", ExpiresAt: time.Now().Add(time.Minute)})
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	base, _ := url.Parse(srv.URL)
	mc := &localproxy.MintClient{Base: base, Identity: fixedIdentity(t, identity)}
	const concurrent, rounds = 16, 10
	for range rounds {
		var wg sync.WaitGroup
		for i := range concurrent {
			wg.Go(func() {
				if _, err := mc.Mint(context.Background(), "conv-"+string(rune('a'+i))); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	if n := opened.Load(); n > 2*concurrent {
		t.Fatalf("%d rounds of %d concurrent mints opened %d connections; want at most %d (one per concurrent mint, reused)",
			rounds, concurrent, n, 2*concurrent)
	} else {
		t.Logf("%d rounds of %d concurrent mints opened %d connections", rounds, concurrent, n)
	}
}
