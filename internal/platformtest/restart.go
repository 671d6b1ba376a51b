package platformtest

import (
	"context"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"sync"
	"testing"

	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/controlstore"
	"github.com/talkide/talkide/internal/devupstream"
	"github.com/talkide/talkide/internal/mint"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker"
)

// Restartable is a Platform whose worker can be restarted in-process on the
// same session volume and address, as a pod restart would.
type Restartable struct {
	*Platform
	wCfg  worker.Config
	wAddr string

	mu sync.Mutex
	// stopWorker stops the running worker and waits for it; guarded by mu.
	stopWorker func()
}

// StartRestartable is Start with a worker that RestartWorker can restart.
func StartRestartable(t testing.TB, opts Options) *Restartable {
	t.Helper()
	bin := ClaudeBin(t)
	dir := AgentReachableTempDir(t)
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	master, err := token.NewMasterKey("t1")
	if err != nil {
		t.Fatal(err)
	}
	p := &Platform{T: t, Master: master, UserToken: "tk_test_" + token.NewID(), Tenant: "demo", Env: "dev", SessionDir: filepath.Join(dir, "sessions")}
	p.Upstream = devupstream.New(devupstream.Config{APIKey: UpstreamAPIKey, Logger: log.With("component", "devupstream")})
	up := httptest.NewServer(p.Upstream)
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	cpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	wLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.URL = "http://" + cpLn.Addr().String()
	p.WorkerURL = "http://" + wLn.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	r := &Restartable{Platform: p, wAddr: wLn.Addr().String()}
	t.Cleanup(func() {
		r.mu.Lock()
		stop := r.stopWorker
		r.mu.Unlock()
		if stop != nil {
			stop()
		}
		cancel()
		wg.Wait()
	})
	p.DBPath = filepath.Join(dir, "cp.db")
	cpCfg := controlplane.Config{
		DBPath: p.DBPath, MasterKeys: []token.MasterKey{master}, Upstream: upURL, APIKey: UpstreamAPIKey,
		WorkerURLTemplate: p.WorkerURL, DevUserToken: p.UserToken, Logger: log.With("component", "controlplane"),
	}
	if err := cpCfg.Validate(); err != nil {
		t.Fatal(err)
	}
	db, err := controlstore.OpenSQLite(ctx, p.DBPath)
	if err != nil {
		t.Fatal(err)
	}
	identity, err := mint.New(db, master, log).IssueIdentity(ctx, p.Tenant, p.Env, 0)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		if err := controlplane.RunWith(ctx, cpCfg, cpLn, opts.Wrap); err != nil {
			t.Errorf("control plane: %v", err)
		}
	})
	cpURL, _ := url.Parse(p.URL)
	r.wCfg = worker.Config{
		Tenant: p.Tenant, Env: p.Env,
		RequestKeys:    []token.Key{master.Derive(token.PurposeWorkerRequest, p.Tenant, p.Env)},
		GatewayBaseURL: cpURL, IdentityToken: identity,
		SessionDir: p.SessionDir, ClaudeBin: bin, IdleTimeout: opts.IdleTimeout,
		CLIExtraEnv: opts.CLIExtraEnv, Logger: log.With("component", "worker"),
	}
	if err := r.wCfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r.startWorker(wLn)
	p.waitHealthy()
	return r
}

func (r *Restartable) startWorker(ln net.Listener) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := worker.Run(ctx, r.wCfg, ln); err != nil {
			r.T.Errorf("worker: %v", err)
		}
	}()
	r.mu.Lock()
	r.stopWorker = func() { cancel(); <-done }
	r.mu.Unlock()
}

// RestartWorker stops the worker (as SIGTERM would) and starts a new one
// on the same session volume and address, then waits until it is ready.
func (r *Restartable) RestartWorker() {
	r.T.Helper()
	r.mu.Lock()
	stop := r.stopWorker
	r.stopWorker = nil
	r.mu.Unlock()
	stop()
	ln, err := net.Listen("tcp", r.wAddr)
	if err != nil {
		r.T.Fatalf("listen again on %s: %v", r.wAddr, err)
	}
	r.startWorker(ln)
	r.waitHealthy()
}
