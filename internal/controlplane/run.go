package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/gateway"
	"github.com/talkide/talkide/internal/controlplane/mint"
	"github.com/talkide/talkide/internal/controlplane/webui"
	"github.com/talkide/talkide/internal/controlplane/workerclient"
	"github.com/talkide/talkide/internal/httpapi"
)

// NewServer assembles the control plane over db, with the gateway-proxy,
// budget and metrics of spend (see newSpendParts). cfg must have passed
// Validate.
func NewServer(cfg Config, db *controlstore.DB, spend *spendParts) (*Server, *mint.Handler) {
	master := cfg.MasterKeys[0]
	cfg.Logger = httpapi.WithRequestIDs(cfg.Logger)
	s := &Server{
		cfg: cfg, db: db, master: master, log: cfg.Logger, mux: http.NewServeMux(),
		workers: &workerDirectory{template: cfg.WorkerURLTemplate, master: master, clients: map[string]*workerclient.Client{},
			transport: workerTransport(spend.files)},
		slots:     &streamSlots{},
		heartbeat: 15 * time.Second,
		draining:  make(chan struct{}),
		upstream:  &upstreamCheck{check: spend.gateway.CheckUpstream},
		budget:    spend.budget,
	}
	base, stopFeeds := context.WithCancel(context.Background())
	s.stopFeeds = stopFeeds
	s.feeds = newFeeds(base, cfg.Logger, s.deletedMeanwhile, s.slots)
	m := mint.New(db, master, cfg.Logger.With("component", "mint"), cfg.MasterKeys[1:]...)
	h := func(f httpapi.HandlerFunc) http.Handler { return httpapi.Handle(s.log, f) }
	s.mux.Handle("GET /api/me", h(s.me))
	s.mux.Handle("POST /api/conversations", h(s.createConversation))
	s.mux.Handle("GET /api/conversations", h(s.listConversations))
	s.mux.Handle("GET /api/conversations/{id}", h(s.getConversation))
	s.mux.Handle("PATCH /api/conversations/{id}", h(s.renameConversation))
	s.mux.Handle("DELETE /api/conversations/{id}", h(s.deleteConversation))
	s.mux.Handle("POST /api/conversations/{id}/messages", h(s.sendMessage))
	s.mux.Handle("POST /api/conversations/{id}/interrupt", h(s.interrupt))
	s.mux.Handle("POST /api/conversations/{id}/permissions/{request_id}", h(s.answerPermission))
	s.mux.Handle("GET /api/conversations/{id}/stream", h(s.stream))
	s.mux.Handle("GET /api/conversations/{id}/calls", h(s.listCalls))
	// Health: /healthz checks the database, the model upstream and the
	// workers of TALKIDE_HEALTH_WORKERS (what an operator or `talkide run`
	// waits for). Readiness, /readyz: this replica's database, and not
	// shutting down. Both turn 503 once shutdown begins. Liveness: /livez
	// answers while the process serves HTTP at all, so a database outage
	// takes replicas out of the Service without restarting them.
	s.mux.Handle("GET /healthz", h(s.healthz))
	s.mux.Handle("GET /readyz", h(s.readyz))
	s.mux.HandleFunc("GET /livez", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.mux.Handle("POST "+contract.PathMint, m)
	spend.register(s.mux, cfg, s.log)
	s.registerReporting()
	s.registerWorkersAPI()
	// The browser UI (internal/controlplane/webui): the page and its hashed assets.
	ui := webui.Handler(s.log)
	s.mux.Handle("GET /{$}", ui)
	s.mux.Handle("GET "+webui.AssetsPrefix, ui)
	// Every request gets a new id; the mint and the gateway adopt the one a
	// worker's local proxy sent once its credential checks out
	// (httpapi.AdoptRequestID), so a model call has one id in both logs.
	s.handler = httpapi.RequestIDs(httpapi.Routes(s.mux, s.log))
	return s, m
}

// Run opens the database, sets up the dev user if configured, and serves on
// ln (or cfg.Addr when ln is nil) until ctx ends. Then it stops accepting,
// turns unready, ends browser streams cleanly and gives requests in flight
// cfg.ShutdownGrace to finish; it returns once their debits are booked.
// Connections and browser streams are capped from the open-files limit
// (limits.go).
func Run(ctx context.Context, cfg Config, ln net.Listener) error {
	cfg.Logger = httpapi.WithRequestIDs(cfg.Logger) // lines about a request carry its id
	db, err := OpenDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	spend := newSpendParts(cfg, db)
	defer spend.close() // after the server stopped: pending debits are booked
	if cfg.DevUserToken != "" {
		if err := db.UpsertUser(ctx, controlstore.User{ID: "dev", TokenHash: controlstore.HashUserToken(cfg.DevUserToken)}, cfg.DevGrants...); err != nil {
			return err
		}
	}
	s, m := NewServer(cfg, db, spend)
	var h http.Handler = s
	if cfg.Middleware != nil {
		h = cfg.Middleware(s)
	}
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.Addr); err != nil {
			return fmt.Errorf("listen %s: %w", cfg.Addr, err)
		}
	}
	if cfg.Provisioner == "kubernetes" {
		p, err := NewProvisioner(cfg, db, m)
		if err != nil {
			ln.Close()
			return err
		}
		s.prov.Store(p)
		// Only once it can serve: its configuration revision then takes
		// the workers over from an older rollout's replicas. It stops
		// with ctx, and is waited for before the database closes.
		var provisioning sync.WaitGroup
		provCtx, stopProvisioning := context.WithCancel(ctx)
		defer func() {
			stopProvisioning() // also when serving failed, not only on a signal
			provisioning.Wait()
		}()
		provisioning.Go(func() {
			if err := p.Run(provCtx); err != nil {
				cfg.Logger.Error("worker provisioner stopped", "err", err)
			}
		})
		buildImage := cfg.Provision.BuildImage
		if buildImage == "" {
			buildImage = "none (TALKIDE_WORKER_BUILD_IMAGE unset): builds in Kubernetes are off"
		}
		cfg.Logger.Info("worker provisioning on", "provisioner", "kubernetes", "image", cfg.Provision.Image,
			"build_image", buildImage, "resync", cfg.Provision.Resync)
	}
	fds := currentFDBudget()
	s.slots.max = int64(fds.MaxStreams)
	spend.files.SetMax(fds.Sockets)
	limited := httpapi.LimitListenerFiles(ln, spend.files, "this control plane is at its connection limit; retry shortly")
	ln = limited
	cfg.Logger.Info("open-files budget", "limit", fds.Limit, "reserved", fds.Reserved, "sockets", fds.Sockets, "max_browser_streams", fds.MaxStreams)
	// Check the model upstream now, so a wrong URL, a missing route or a
	// refused API key shows in the log at start, not as the first turn's
	// failure; readiness (/healthz) keeps checking.
	if err := s.upstream.result(ctx); err != nil {
		msg := "model upstream cannot be reached: model calls fail until it can"
		if ue, ok := errors.AsType[*gateway.UpstreamError](err); ok && ue.KeyRefused {
			msg = "model upstream refused the API key (ANTHROPIC_API_KEY): model calls fail until it is replaced"
		}
		cfg.Logger.Error(msg, "upstream", cfg.Upstream.Redacted(), "err", err)
	}
	cfg.Logger.Info("control plane listening", "addr", ln.Addr().String(), "upstream", cfg.Upstream.Redacted())
	// Requests do not derive from ctx (the signal context): SIGTERM must
	// not cut the gateway calls in flight. When ctx ends, the server stops
	// accepting and BeginShutdown ends the browser streams; calls in flight
	// get cfg.ShutdownGrace to finish, then the rest are cut (reqCtx ends)
	// and booked for what is known. The worker does the same
	// (internal/worker Run).
	reqCtx, cut := context.WithCancel(context.WithoutCancel(ctx))
	defer cut()
	srv := httpapi.NewServer(reqCtx, ln.Addr().String(), h, cfg.Logger)
	limited.ShedIdleWhenFull(srv)           // browsers' idle keep-alives give way to calls with work
	srv.RegisterOnShutdown(s.BeginShutdown) // runs once the listener is closed
	err = httpapi.Serve(ctx, srv, ln, cfg.ShutdownGrace)
	s.BeginShutdown() // also when serving failed: the relays end
	// The browser streams taken over from the server ended with the
	// shutdown comment (BeginShutdown); wait for their last writes.
	relaysDone := make(chan struct{})
	go func() { s.relays.Wait(); close(relaysDone) }()
	select {
	case <-relaysDone:
	case <-time.After(streamWriteTimeout):
		cfg.Logger.Warn("browser streams still writing at exit")
	}
	cfg.Logger.Info("control plane stopped serving", "err", err)
	return err
}

// workerTransport reaches the workers as http.DefaultTransport does, its
// sockets counted in files and its idle ones bounded (32 per worker, 256
// in all).
func workerTransport(files *httpapi.Files) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = files.DialContext(&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second})
	t.MaxIdleConnsPerHost = 32
	t.MaxIdleConns = 256
	return t
}
