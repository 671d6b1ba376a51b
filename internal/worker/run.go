package worker

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker/claudecli"
	"github.com/talkide/talkide/internal/worker/harness"
	"github.com/talkide/talkide/internal/worker/lease"
	"github.com/talkide/talkide/internal/worker/localproxy"
	"github.com/talkide/talkide/internal/worker/sandbox"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// Run runs the worker until ctx ends: it checks the CLI version, opens the
// SessionStore, starts the LocalGatewayProxyServer, the harness and the API
// server (on ln when non-nil, else on c.Addr), and on shutdown stops the CLI
// processes and waits for everything. c must have passed Validate. When the
// identity token can no longer mint and no successor appears within
// c.IdentityFailureGrace, it shuts down the same way and returns an
// *IdentityError.
//
// Run owns ln from the call on: it is closed when Run returns, as is
// everything Run opened, whether start-up failed or not.
func Run(ctx context.Context, c Config, ln net.Listener) error {
	var res resources
	defer res.release()
	if ln != nil {
		res.own(ln)
	}
	w, err := assemble(ctx, c, ln, &res)
	if err != nil {
		return err
	}
	return w.serve(ctx)
}

// resources is what Run opened that outlives a function call: listeners,
// the jail's cgroups. Each is handed to it once, right after it is opened,
// and released there alone, last first, when Run returns; a listener a
// server already closed on its way out is closed again harmlessly.
type resources struct{ undo []func() }

// own has c closed when Run returns, before what was added earlier.
func (r *resources) own(c interface{ Close() error }) {
	r.undo = append(r.undo, func() { _ = c.Close() })
}

// add has f run when Run returns, before what was added earlier.
func (r *resources) add(f func()) { r.undo = append(r.undo, f) }

func (r *resources) release() {
	for i := len(r.undo) - 1; i >= 0; i-- {
		r.undo[i]()
	}
}

// A worker is what assemble made of a Config: every part built and wired,
// nothing running yet. Its listeners and cgroups belong to Run's resources.
type worker struct {
	c        Config
	log      *slog.Logger
	self     lease.Identity
	ln       net.Listener // the API's, within the connection budget
	local    *localproxy.Server
	localLn  net.Listener
	identity *localproxy.Identity // nil in development mode (no control plane)
	rep      *reporting
	bld      *builds
	h        *harness.Harness
	api      *Server
}

// assemble builds the worker's parts from c in dependency order, handing
// every listener and cgroup to res as soon as it exists. It starts no
// goroutine; an error leaves nothing but what res releases.
func assemble(ctx context.Context, c Config, ln net.Listener, res *resources) (*worker, error) {
	w := &worker{c: c, log: c.Logger.With("tenant", c.Tenant, "env", c.Env)}
	log := w.log
	if err := claudecli.CheckVersion(ctx, c.ClaudeBin); err != nil {
		return nil, err
	}
	gp, mc, err := newGatewayProxy(c, log)
	if err != nil {
		return nil, err
	}
	if mc != nil {
		w.identity = mc.Identity
	}
	store, err := sessionstore.Open(filepath.Join(c.SessionDir, "talkide"))
	if err != nil {
		return nil, err
	}
	store.KeepEvents = c.KeepEvents
	if ln == nil {
		if ln, err = net.Listen("tcp", c.Addr); err != nil {
			return nil, fmt.Errorf("listen %s: %w", c.Addr, err)
		}
		res.own(ln)
	}
	w.local = localproxy.NewServer(gp, log.With("component", "local-gateway-proxy"))
	if w.localLn, err = w.local.Listen(); err != nil {
		return nil, err
	}
	res.own(w.localLn)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if w.rep, err = newReporting(c, mc, store, log, reg); err != nil {
		return nil, err
	}
	w.self = lease.Identity{Holder: c.WorkerID, Incarnation: token.NewID(), Address: advertise(c, ln)}
	leases, err := newLeaseManager(c, w.self)
	if err != nil {
		return nil, err
	}
	agent, agentUIDs, err := agentAccounts(c, log)
	if err != nil {
		return nil, err
	}
	// The open-files budget is divided now, with what start-up opened so
	// far; the few files opened below come out of the reserve.
	maxProcs := c.MaxProcesses
	if maxProcs <= 0 {
		maxProcs = 4 // the harness's default
	}
	budget := newFDBudget(httpapi.OpenFilesLimit(), openFiles(httpapi.OpenFilesLimit()), maxProcs)
	limits := newAdmission(budget, maxProcs, func() int { return w.h.LiveProcesses() },
		cachedFor(openFilesTTL, func() int { return openFiles(budget.Limit) }), c.SessionDir, c.MinFreeDisk)
	log.Info("open-files budget", "budget", budget.String(), "min_free_disk_mib", c.MinFreeDisk>>20, "go_memory_limit_mib", limits.memLimit>>20)
	w.ln = httpapi.LimitListener(ln, budget.MaxConns, "this worker serves its limit of connections; retry shortly")
	probe := agent
	if agentUIDs != nil {
		probe = &sandbox.Nobody
	}
	jail, containment, err := newJail(c, cgroupName(w.self), probe, agentUIDs != nil, log)
	if err != nil {
		return nil, err
	}
	res.add(func() { closeCgroups(jail) })
	logContainment(containment, log)
	reg.MustRegister(containmentGauge(containment))
	if w.bld, err = newBuilds(c, store, jail, kubeClient, log); err != nil {
		return nil, err
	}
	w.rep.mcp.builds = w.bld.server
	hc := harnessConfig(c, log)
	hc.AgentUser, hc.AgentUIDs, hc.Jail = agent, agentUIDs, jail
	hc.Leases, hc.Identity = leases, w.self
	hc.MCP, hc.OnEvent = w.rep.mcp, w.rep.notify
	hc.AdmitLoad = limits.admitLoad
	if w.h, err = harness.New(hc, store, w.local); err != nil {
		return nil, err
	}
	if n, err := w.h.ReclaimOrphanUIDs(); err != nil {
		log.Error("release agent uids of deleted conversations", "err", err)
	} else if n > 0 {
		log.Info("released agent uids of deleted conversations", "count", n)
	}
	w.h.RegisterMetrics(reg)
	w.api = NewServer(w.h, c.Tenant, c.Env, c.RequestKeys, log.With("component", "api"))
	w.api.identity = w.self.Holder
	w.api.limits = limits
	w.api.containment = containment
	w.api.builds = w.bld.server
	w.api.mux.Handle("GET /metrics", httpapi.Handle(log, httpapi.MetricsAuth(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), c.MetricsToken)))
	return w, nil
}

// serve starts every part and runs until ctx ends or one of them fails,
// then shuts down in order: readiness turns false; the harness winds down
// (running turns finish or are interrupted, leases released) while the API
// and the local proxy keep serving (status, events, the CLI's last model
// calls); then reporting, the API and the local proxy stop. It returns the
// first part's error, or nil.
func (w *worker) serve(ctx context.Context) error {
	serveCtx, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServing()
	hctx, stopHarness := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHarness()
	srv := httpapi.NewServer(serveCtx, w.ln.Addr().String(), w.api, w.log)
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	harnessDone := make(chan struct{})
	wg.Go(func() { errc <- w.local.Serve(serveCtx, w.localLn) })
	if w.identity != nil {
		wg.Go(func() {
			errc <- watchIdentity(serveCtx, w.identity, w.c.IdentityFailureGrace, w.api, w.log.With("component", "identity"))
		})
	}
	wg.Go(func() { defer close(harnessDone); errc <- w.h.Run(hctx) })
	stopReporting := w.rep.start(serveCtx, w.h)
	if n, err := w.h.Recover(); err != nil {
		w.log.Error("recover conversations", "err", err)
	} else if n > 0 {
		w.log.Info("recovered conversations with waiting or interrupted work", "count", n)
	}
	wg.Go(func() { w.bld.run(serveCtx, w.h) })
	w.log.Info("worker listening", "addr", w.ln.Addr().String(), "worker_id", w.self.Holder, "advertise", w.self.Address,
		"leases", w.c.LeaseBackend, "claude_code", claudecli.PinnedVersion)
	wg.Go(func() { errc <- httpapi.Serve(serveCtx, srv, w.ln, 5*time.Second) })

	var first error
	select {
	case <-ctx.Done():
	case first = <-errc:
	}
	w.api.notReady.Store(true)
	w.log.Info("worker stopping")
	// Build Jobs outlive the worker: the next one delivers their results.
	w.bld.server.Detach()
	stopHarness()
	<-harnessDone
	stopReporting() // after the harness: its last events are reported too
	stopServing()
	wg.Wait()
	close(errc)
	for err := range errc {
		if first == nil && err != nil {
			first = err
		}
	}
	return first
}

// newGatewayProxy returns how the CLI's model calls leave the worker: the
// MintingGatewayProxy with the identity token's mint client, or, in
// development mode (c.NoOpUpstream set), the NoOpGatewayProxy and a nil
// client.
func newGatewayProxy(c Config, log *slog.Logger) (localproxy.GatewayProxy, *localproxy.MintClient, error) {
	if c.NoOpUpstream != nil {
		log.Warn("development mode: model calls go straight to the upstream with a local key (NoOpGatewayProxy)", "upstream", c.NoOpUpstream.String())
		return &localproxy.NoOpGatewayProxy{Upstream: c.NoOpUpstream, APIKey: c.NoOpAPIKey}, nil, nil
	}
	id, err := c.newIdentity()
	if err != nil {
		return nil, nil, err
	}
	mc := &localproxy.MintClient{Base: c.GatewayBaseURL, Identity: id}
	return &localproxy.MintingGatewayProxy{Gateway: c.GatewayBaseURL, Mint: mc}, mc, nil
}

// harnessConfig is the part of the harness's configuration that comes
// straight from c; assemble adds the parts it built.
func harnessConfig(c Config, log *slog.Logger) harness.Config {
	return harness.Config{
		PermissionPolicy:  c.PermissionPolicy,
		PermissionTimeout: c.PermissionTimeout,
		MaxProcesses:      c.MaxProcesses,
		ShutdownGrace:     c.ShutdownGrace,
		TmpRoot:           c.CLITmpDir,
		ClaudeBin:         c.ClaudeBin,
		ConfigDir:         c.ClaudeConfigDir,
		WorkspaceRoot:     filepath.Join(c.SessionDir, "workspaces"),
		HomeDir:           filepath.Join(c.SessionDir, "home"),
		Model:             c.Model,
		PermissionMode:    c.PermissionMode,
		IdleTimeout:       c.IdleTimeout,
		ExtraEnv:          c.CLIExtraEnv,
		DiskLimit:         c.AgentLimits.DiskBytes,
		DiskFileLimit:     c.AgentLimits.DiskFiles,
		Logger:            log.With("component", "harness"),

		MaxConversations:        c.MaxConversations,
		MaxConversationsPerUser: c.MaxConversationsPerUser,
		MaxProcessesPerUser:     c.MaxProcessesPerUser,
	}
}

// advertise returns the URL other replicas use to reach this one.
func advertise(c Config, ln net.Listener) string {
	if c.AdvertiseURL != "" {
		return strings.TrimRight(c.AdvertiseURL, "/")
	}
	host, port, err := net.SplitHostPort(ln.Addr().String())
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = os.Getenv("POD_IP")
		if host == "" {
			host, _ = os.Hostname()
		}
	}
	return "http://" + net.JoinHostPort(host, port)
}
