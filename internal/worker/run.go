package worker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/talkide/talkide/internal/claudecli"
	"github.com/talkide/talkide/internal/gatewayproxy"
	"github.com/talkide/talkide/internal/harness"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/sessionstore"
	"github.com/talkide/talkide/internal/token"
)

// Config is the worker's configuration, read from the environment by
// cmd/talkide-worker (names in brackets). Zero values take the defaults noted.
type Config struct {
	// Tenant and Env name the tenant-env this worker serves
	// [TALKIDE_TENANT, TALKIDE_ENV]. Required.
	Tenant, Env string
	// Addr is the API listen address [TALKIDE_WORKER_ADDR]. Default ":8080".
	Addr string
	// RequestKeys verify the control plane's request tokens
	// [TALKIDE_WORKER_REQUEST_KEYS, "kid:base64url,..."]. Required.
	RequestKeys []token.Key
	// GatewayBaseURL is the control plane [TALKIDE_GATEWAY_BASE_URL]; with
	// IdentityToken [TALKIDE_WORKER_IDENTITY_TOKEN] model calls go through
	// MintingGatewayProxy. Required unless NoOpUpstream is set.
	GatewayBaseURL *url.URL
	IdentityToken  string
	// NoOpUpstream and NoOpAPIKey select NoOpGatewayProxy (development only:
	// straight to an Anthropic-compatible upstream with a local key)
	// [TALKIDE_NOOP_UPSTREAM_URL, ANTHROPIC_API_KEY].
	NoOpUpstream *url.URL
	NoOpAPIKey   string
	// SessionDir is the session volume [TALKIDE_SESSION_DIR]. Default /data/claude.
	SessionDir string
	// ClaudeConfigDir is the CLI's CLAUDE_CONFIG_DIR [CLAUDE_CONFIG_DIR].
	// Default <SessionDir>/claude-config.
	ClaudeConfigDir string
	// ClaudeBin is the CLI [TALKIDE_CLAUDE_BIN]. Default: see claudecli.Find.
	ClaudeBin string
	// Model is the default model [TALKIDE_MODEL]; empty: the CLI's default.
	Model string
	// PermissionMode is the CLI's --permission-mode [TALKIDE_PERMISSION_MODE].
	PermissionMode string
	// IdleTimeout stops idle CLI processes [TALKIDE_IDLE_TIMEOUT, a Go duration].
	IdleTimeout time.Duration
	// CLIExtraEnv are extra CLI environment entries
	// [TALKIDE_CLI_EXTRA_ENV, "NAME=value,NAME=value"].
	CLIExtraEnv []string
	// ShutdownGrace bounds the graceful shutdown. Default 20 s.
	ShutdownGrace time.Duration
	Logger        *slog.Logger
}

// Validate applies defaults and checks c, returning an error that tells the
// operator what to set.
func (c *Config) Validate() error {
	var errs []error
	if c.Tenant == "" || c.Env == "" {
		errs = append(errs, errors.New("set TALKIDE_TENANT and TALKIDE_ENV"))
	}
	if len(c.RequestKeys) == 0 {
		errs = append(errs, errors.New("set TALKIDE_WORKER_REQUEST_KEYS (the control plane prints them: talkide-controlplane worker-credentials)"))
	}
	switch {
	case c.NoOpUpstream != nil:
	case c.GatewayBaseURL == nil || c.IdentityToken == "":
		errs = append(errs, errors.New("set TALKIDE_GATEWAY_BASE_URL and TALKIDE_WORKER_IDENTITY_TOKEN (or, for development only, TALKIDE_NOOP_UPSTREAM_URL)"))
	default:
		if err := checkIdentityToken(c.IdentityToken, c.Tenant, c.Env); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Addr == "" {
		c.Addr = ":8080"
	}
	if c.SessionDir == "" {
		c.SessionDir = "/data/claude"
	}
	if c.ClaudeConfigDir == "" {
		c.ClaudeConfigDir = filepath.Join(c.SessionDir, "claude-config")
	}
	if c.ClaudeBin == "" {
		bin, err := claudecli.Find()
		if err != nil {
			errs = append(errs, err)
		}
		c.ClaudeBin = bin
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = 20 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return errors.Join(errs...)
}

// checkIdentityToken reads the (unverified: the worker has no key) claims of
// the identity token to fail fast when it names another tenant-env.
func checkIdentityToken(tok, tenant, env string) error {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return errors.New("TALKIDE_WORKER_IDENTITY_TOKEN is not a token")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return errors.New("TALKIDE_WORKER_IDENTITY_TOKEN is not a token")
	}
	var c token.Claims
	if err := json.Unmarshal(payload, &c); err != nil {
		return errors.New("TALKIDE_WORKER_IDENTITY_TOKEN is not a token")
	}
	if c.Purpose != token.PurposeIdentity {
		return fmt.Errorf("TALKIDE_WORKER_IDENTITY_TOKEN is a %q token, want an identity token", c.Purpose)
	}
	if c.Tenant != tenant || c.Env != env {
		return fmt.Errorf("TALKIDE_WORKER_IDENTITY_TOKEN is bound to %s/%s, but this worker serves %s/%s", c.Tenant, c.Env, tenant, env)
	}
	if c.ExpiresAt != nil && time.Now().After(c.ExpiresAt.Time) {
		return fmt.Errorf("TALKIDE_WORKER_IDENTITY_TOKEN expired at %s", c.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return nil
}

// Run runs the worker until ctx ends: it checks the CLI version, opens the
// SessionStore, starts the LocalGatewayProxyServer, the harness and the API
// server (on ln when non-nil, else on c.Addr), and on shutdown stops the CLI
// processes and waits for everything. c must have passed Validate.
func Run(ctx context.Context, c Config, ln net.Listener) error {
	log := c.Logger.With("tenant", c.Tenant, "env", c.Env)
	if err := claudecli.CheckVersion(ctx, c.ClaudeBin); err != nil {
		return err
	}
	store, err := sessionstore.Open(filepath.Join(c.SessionDir, "talkide"))
	if err != nil {
		return err
	}
	var gp gatewayproxy.GatewayProxy
	if c.NoOpUpstream != nil {
		log.Warn("development mode: model calls go straight to the upstream with a local key (NoOpGatewayProxy)", "upstream", c.NoOpUpstream.String())
		gp = &gatewayproxy.NoOpGatewayProxy{Upstream: c.NoOpUpstream, APIKey: c.NoOpAPIKey}
	} else {
		gp = &gatewayproxy.MintingGatewayProxy{Gateway: c.GatewayBaseURL, Mint: &gatewayproxy.MintClient{Base: c.GatewayBaseURL, IdentityToken: c.IdentityToken}}
	}
	local := gatewayproxy.NewServer(gp, log.With("component", "local-gateway-proxy"))
	localLn, err := local.Listen()
	if err != nil {
		return err
	}
	h, err := harness.New(harness.Config{
		ClaudeBin:      c.ClaudeBin,
		ConfigDir:      c.ClaudeConfigDir,
		WorkspaceRoot:  filepath.Join(c.SessionDir, "workspaces"),
		HomeDir:        filepath.Join(c.SessionDir, "home"),
		Model:          c.Model,
		PermissionMode: c.PermissionMode,
		IdleTimeout:    c.IdleTimeout,
		ExtraEnv:       c.CLIExtraEnv,
		Logger:         log.With("component", "harness"),
	}, store, local)
	if err != nil {
		localLn.Close()
		return err
	}
	if ln == nil {
		ln, err = net.Listen("tcp", c.Addr)
		if err != nil {
			localLn.Close()
			return fmt.Errorf("listen %s: %w", c.Addr, err)
		}
	}
	api := NewServer(h, c.Tenant, c.Env, c.RequestKeys, log.With("component", "api"))
	srv := httpapi.NewServer(ctx, ln.Addr().String(), api, log)

	// Children get their own context so the API keeps answering (readiness
	// false, status) while the harness winds down.
	hctx, stopHarness := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHarness()
	var wg sync.WaitGroup
	errc := make(chan error, 3)
	wg.Go(func() { errc <- local.Serve(hctx, localLn) })
	wg.Go(func() { errc <- h.Run(hctx) })
	if n, err := h.Recover(); err != nil {
		log.Error("recover conversations", "err", err)
	} else if n > 0 {
		log.Info("resumed conversations with waiting messages", "count", n)
	}
	log.Info("worker listening", "addr", ln.Addr().String(), "claude_code", claudecli.PinnedVersion)
	wg.Go(func() { errc <- httpapi.Serve(ctx, srv, ln, c.ShutdownGrace) })

	var first error
	select {
	case <-ctx.Done():
	case first = <-errc:
	}
	api.notReady.Store(true)
	stopHarness()
	wg.Wait()
	close(errc)
	for err := range errc {
		if first == nil && err != nil {
			first = err
		}
	}
	return first
}

// ParseExtraEnv splits "NAME=value,NAME=value".
func ParseExtraEnv(s string) []string {
	var out []string
	for kv := range strings.SplitSeq(s, ",") {
		if kv = strings.TrimSpace(kv); kv != "" {
			out = append(out, kv)
		}
	}
	return out
}
