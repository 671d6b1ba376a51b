// Command talkide-worker runs the per-tenant worker: the Claude Code
// sessions of one tenant-env, behind a signed HTTP API for the control plane.
// Configuration comes from the environment; see worker.Config and the README.
//
// Exit status: 0 after SIGTERM or SIGINT; 78 (contract.ExitConfig) for an
// invalid configuration; 77 (worker.ExitIdentity) when the identity token
// was revoked, expired or refused and no new one appeared within
// TALKIDE_IDENTITY_FAILURE_GRACE; 1 for any other failure.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/harden"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker"
	"github.com/talkide/talkide/internal/worker/sandbox"
)

func main() {
	// The binary is also the helper of agents' jails (their network).
	sandbox.MaybeRunHelper()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "talkide-worker:", err)
		if errors.As(err, new(*contract.ConfigError)) {
			os.Exit(contract.ExitConfig)
		}
		if errors.As(err, new(*worker.IdentityError)) {
			os.Exit(worker.ExitIdentity)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	// Non-dumpable: the agents this worker runs cannot read its environment
	// (identity token, request keys) through /proc.
	if err := harden.Process(); err != nil {
		return err
	}
	cfg, err := configFromEnv()
	if err != nil {
		return &contract.ConfigError{Err: err}
	}
	return worker.Run(ctx, cfg, nil)
}

func configFromEnv() (worker.Config, error) {
	cfg := worker.Config{
		Tenant:            os.Getenv("TALKIDE_TENANT"),
		Env:               os.Getenv("TALKIDE_ENV"),
		Addr:              os.Getenv("TALKIDE_WORKER_ADDR"),
		IdentityToken:     os.Getenv("TALKIDE_WORKER_IDENTITY_TOKEN"),
		IdentityTokenFile: os.Getenv("TALKIDE_WORKER_IDENTITY_TOKEN_FILE"),
		SessionDir:        os.Getenv("TALKIDE_SESSION_DIR"),
		ClaudeConfigDir:   os.Getenv("CLAUDE_CONFIG_DIR"),
		ClaudeBin:         os.Getenv("TALKIDE_CLAUDE_BIN"),
		Model:             os.Getenv("TALKIDE_MODEL"),
		PermissionMode:    os.Getenv("TALKIDE_PERMISSION_MODE"),
		WorkerID:          os.Getenv("TALKIDE_WORKER_ID"),
		AdvertiseURL:      os.Getenv("TALKIDE_WORKER_ADVERTISE_URL"),
		LeaseBackend:      os.Getenv("TALKIDE_LEASE_BACKEND"),
		CLITmpDir:         os.Getenv("TALKIDE_CLI_TMP_DIR"),
		AgentUser:         os.Getenv("TALKIDE_AGENT_USER"),
		PermissionPolicy:  os.Getenv("TALKIDE_PERMISSION_POLICY"),
		HostUIDDir:        os.Getenv("TALKIDE_HOST_UID_DIR"),
		MetricsToken:      os.Getenv("TALKIDE_METRICS_TOKEN"),
		CLIExtraEnv:       worker.ParseExtraEnv(os.Getenv("TALKIDE_CLI_EXTRA_ENV")),
		Logger:            slog.New(slog.NewJSONHandler(os.Stderr, nil)),
	}
	if v := os.Getenv("TALKIDE_WORKER_REQUEST_KEYS"); v != "" {
		keys, err := token.ParseKeys(v)
		if err != nil {
			return cfg, fmt.Errorf("TALKIDE_WORKER_REQUEST_KEYS: %w", err)
		}
		cfg.RequestKeys = keys
	}
	for name, dst := range map[string]**url.URL{"TALKIDE_GATEWAY_BASE_URL": &cfg.GatewayBaseURL, "TALKIDE_NOOP_UPSTREAM_URL": &cfg.NoOpUpstream} {
		if v := os.Getenv(name); v != "" {
			u, err := url.Parse(v)
			if err != nil || u.Scheme == "" || u.Host == "" {
				return cfg, fmt.Errorf("%s %q: want an absolute URL", name, v)
			}
			*dst = u
		}
	}
	if v := os.Getenv("TALKIDE_MIN_FREE_DISK"); v != "" {
		n, err := worker.ParseBytes(v)
		if err != nil {
			return cfg, fmt.Errorf("TALKIDE_MIN_FREE_DISK: %w", err)
		}
		cfg.MinFreeDisk = n
	}
	if err := worker.ParseContainment(os.Getenv, &cfg); err != nil {
		return cfg, err
	}
	policy, err := worker.ParseMCPPolicy(os.Getenv)
	if err != nil {
		return cfg, err
	}
	cfg.MCPPolicy = policy
	if cfg.NoOpUpstream != nil {
		cfg.NoOpAPIKey = os.Getenv("ANTHROPIC_API_KEY")
	}
	cfg.Builds = worker.BuildConfig{Mode: os.Getenv("TALKIDE_BUILDS"), Image: os.Getenv("TALKIDE_BUILD_IMAGE"), Gradle: os.Getenv("TALKIDE_BUILD_GRADLE")}
	if cfg.Builds.NodeSelector, err = worker.ParseSelector(os.Getenv("TALKIDE_BUILD_NODE_SELECTOR")); err != nil {
		return cfg, fmt.Errorf("TALKIDE_BUILD_NODE_SELECTOR: %w", err)
	}
	if cfg.Builds.Tolerations, err = worker.ParseTolerations(os.Getenv("TALKIDE_BUILD_TOLERATIONS")); err != nil {
		return cfg, fmt.Errorf("TALKIDE_BUILD_TOLERATIONS: %w", err)
	}
	for name, dst := range map[string]*time.Duration{"TALKIDE_IDLE_TIMEOUT": &cfg.IdleTimeout, "TALKIDE_SHUTDOWN_GRACE": &cfg.ShutdownGrace, "TALKIDE_PERMISSION_TIMEOUT": &cfg.PermissionTimeout,
		"TALKIDE_IDENTITY_FAILURE_GRACE": &cfg.IdentityFailureGrace, "TALKIDE_BUILD_TIMEOUT": &cfg.Builds.Timeout, "TALKIDE_BUILD_PENDING_TIMEOUT": &cfg.Builds.PendingTimeout} {
		if v := os.Getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return cfg, fmt.Errorf("%s %q: want a positive duration such as 10m", name, v)
			}
			*dst = d
		}
	}
	switch cfg.HostUIDDir {
	case "":
		cfg.HostUIDDir = sandbox.DefaultHostUIDDir
	case "none":
		// A pod in a user namespace of its own: its uids are its alone on
		// the node, so no node-wide claims.
		cfg.HostUIDDir = ""
	}
	for name, dst := range map[string]*int{"TALKIDE_MAX_PROCESSES": &cfg.MaxProcesses, "TALKIDE_MAX_PROCESSES_PER_USER": &cfg.MaxProcessesPerUser, "TALKIDE_EVENT_RETENTION": &cfg.KeepEvents,
		"TALKIDE_MAX_CONVERSATIONS_PER_TENANT_ENV": &cfg.MaxConversations, "TALKIDE_MAX_CONVERSATIONS_PER_USER": &cfg.MaxConversationsPerUser,
		"TALKIDE_BUILD_MAX_CONCURRENT": &cfg.Builds.MaxConcurrent} {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return cfg, fmt.Errorf("%s %q: want a positive integer", name, v)
			}
			*dst = n
		}
	}
	return cfg, cfg.Validate()
}
