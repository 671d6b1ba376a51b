package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker/claudecli"
	"github.com/talkide/talkide/internal/worker/localproxy"
	"github.com/talkide/talkide/internal/worker/mcppolicy"
	"github.com/talkide/talkide/internal/worker/sandbox"
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
	// the identity token model calls go through MintingGatewayProxy.
	// Required unless NoOpUpstream is set.
	GatewayBaseURL *url.URL
	// IdentityToken is the identity token [TALKIDE_WORKER_IDENTITY_TOKEN];
	// IdentityTokenFile a file holding it
	// [TALKIDE_WORKER_IDENTITY_TOKEN_FILE], e.g. the Secret
	// talkide-worker-token mounted as a volume: a token written there later
	// is taken without a restart (localproxy.Identity). Exactly one is
	// required unless NoOpUpstream is set.
	IdentityToken     string
	IdentityTokenFile string
	// IdentityFailureGrace is how long a worker whose identity token was
	// revoked, expired or refused stays up, unready, waiting for a new
	// token in IdentityTokenFile, before Run returns an *IdentityError
	// [TALKIDE_IDENTITY_FAILURE_GRACE]. Default 60 s.
	IdentityFailureGrace time.Duration
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
	// ShutdownGrace is how long running turns may go on after SIGTERM
	// before they are interrupted [TALKIDE_SHUTDOWN_GRACE]. Default 20 s
	// (keep it below the pod's terminationGracePeriodSeconds).
	ShutdownGrace time.Duration
	// WorkerID names this replica for conversation leases
	// [TALKIDE_WORKER_ID]. Default: the host name (the pod name).
	WorkerID string
	// AdvertiseURL is where other replicas reach this one to forward
	// requests for conversations it owns [TALKIDE_WORKER_ADVERTISE_URL].
	// Default: http://<listen address>, or http://$POD_IP:<port> when
	// listening on all interfaces.
	AdvertiseURL string
	// LeaseBackend is "file" (leases on the session volume; the default) or
	// "kubernetes" (coordination.k8s.io Lease objects, with the credentials
	// of $KUBECONFIG or else the pod's service account, in $POD_NAMESPACE
	// or else the pod's or the kubeconfig context's namespace)
	// [TALKIDE_LEASE_BACKEND].
	LeaseBackend string
	// MaxProcesses caps live CLI processes [TALKIDE_MAX_PROCESSES]. Default 4.
	MaxProcesses int
	// MaxProcessesPerUser caps one user's live CLI processes
	// [TALKIDE_MAX_PROCESSES_PER_USER], 1 to MaxProcesses. Default
	// MaxProcesses-1 (1 when that is 1): one slot is always left for the
	// others (harness.Config.MaxProcessesPerUser).
	MaxProcessesPerUser int
	// MCPPolicy decides which servers of a project's .mcp.json are offered
	// to the CLI [TALKIDE_MCP_ALLOW_COMMANDS, TALKIDE_MCP_ALLOW_URLS]; the
	// zero value allows none.
	MCPPolicy mcppolicy.Policy
	// AgentUser is the account the agent (the CLI and every command it
	// runs) runs as [TALKIDE_AGENT_USER]: "per-conversation" (a user id of
	// its own per conversation, from 200000; the default when the worker runs
	// as root), "uid:gid" or a user name (one account for all), or "self"
	// (the worker's own; the default otherwise). The worker is non-dumpable,
	// so an agent of its own user cannot read its environment either.
	AgentUser string
	// PermissionPolicy is "allow" (every tool call the agent asks about is
	// allowed; the default) or "ask" (each becomes a permission_requested
	// event the control plane answers) [TALKIDE_PERMISSION_POLICY].
	PermissionPolicy string
	// PermissionTimeout denies an unanswered permission request after this
	// long [TALKIDE_PERMISSION_TIMEOUT]. Default 5 minutes.
	PermissionTimeout time.Duration
	// KeepEvents bounds each conversation's event log (the oldest events are
	// dropped beyond it) [TALKIDE_EVENT_RETENTION]. Default 10000.
	KeepEvents int
	// MaxConversations caps the conversations of this tenant-env on the
	// session volume [TALKIDE_MAX_CONVERSATIONS_PER_TENANT_ENV];
	// MaxConversationsPerUser one user's among them
	// [TALKIDE_MAX_CONVERSATIONS_PER_USER]. A create beyond a cap is 429.
	// Defaults 1000 and 100 (the control plane enforces the same settings
	// first; these are its backstop).
	MaxConversations, MaxConversationsPerUser int
	// HostUIDDir is the host-wide directory of agent uid claims, shared by
	// every worker on the machine so no two hand out the same uid
	// [TALKIDE_HOST_UID_DIR; cmd/talkide-worker defaults it to
	// /run/talkide/uids]. Empty: this worker is alone on its host.
	HostUIDDir string
	// AgentUIDRange is the First and Count of the per-conversation agent
	// uids (Dir and HostDir come from SessionDir and HostUIDDir). Zero:
	// sandbox.DefaultUIDs. Every worker of a host must use the same range
	// with the same HostUIDDir.
	AgentUIDRange sandbox.UIDRange
	// MetricsToken is the bearer token GET /metrics requires
	// [TALKIDE_METRICS_TOKEN, at least 16 characters]. Empty: /metrics
	// answers 403 (the agent shares the worker's host and loopback).
	MetricsToken string
	// Containment is ContainmentStrict (the default: every agent runs in a
	// jail of its own, see sandbox.Jail, and the worker refuses to start
	// where it cannot build one) or ContainmentWeak [TALKIDE_CONTAINMENT].
	Containment string
	// ContainmentRequire are guarantees (contract.Guarantees names) the
	// worker refuses to start without [TALKIDE_CONTAINMENT_REQUIRE,
	// comma-separated]. Empty: it starts with what the host gives and
	// reports the rest (log, metric, GET /v1/worker).
	ContainmentRequire []string
	// AgentLimits are each conversation's limits [TALKIDE_AGENT_MEMORY,
	// TALKIDE_AGENT_PROCESSES, TALKIDE_AGENT_CPU_WEIGHT, TALKIDE_AGENT_DISK,
	// TALKIDE_AGENT_FILES]; zero fields take sandbox.DefaultLimits (2 GiB,
	// 512, 100, 10 GiB, 500,000), -1 means none. The disk and file limits
	// hold in weak containment too.
	AgentLimits sandbox.Limits
	// AgentNetwork is AgentNetworkPrivate (the default: each agent a
	// network namespace of its own, reaching only its local gateway proxy)
	// or AgentNetworkHost (agents share the worker's network)
	// [TALKIDE_AGENT_NETWORK].
	AgentNetwork string
	// AgentReadPaths are host paths agents see read-only besides
	// sandbox.DefaultReadOnly [TALKIDE_AGENT_READ_PATHS].
	AgentReadPaths []string
	// MinFreeDisk is the free space of the session volume below which new
	// work (creates, messages, streams, loads) is refused with 503
	// [TALKIDE_MIN_FREE_DISK, a size such as 256MiB, or none]. Default
	// 256 MiB; -1: not checked. See limits.go for the other limits.
	MinFreeDisk int64
	// CLITmpDir holds the CLI processes' private temp dirs, on local disk
	// [TALKIDE_CLI_TMP_DIR]. Default <os temp dir>/talkide-cli/<WorkerID>.
	CLITmpDir string
	// Builds configures the agent's build tool (talkide-build).
	Builds BuildConfig
	Logger *slog.Logger
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
	case c.IdentityToken != "" && c.IdentityTokenFile != "":
		errs = append(errs, errors.New("set TALKIDE_WORKER_IDENTITY_TOKEN or TALKIDE_WORKER_IDENTITY_TOKEN_FILE, not both"))
	case c.NoOpUpstream != nil:
	case c.GatewayBaseURL == nil || (c.IdentityToken == "" && c.IdentityTokenFile == ""):
		errs = append(errs, errors.New("set TALKIDE_GATEWAY_BASE_URL and TALKIDE_WORKER_IDENTITY_TOKEN or TALKIDE_WORKER_IDENTITY_TOKEN_FILE (or, for development only, TALKIDE_NOOP_UPSTREAM_URL)"))
	case c.Tenant != "" && c.Env != "":
		if _, err := c.newIdentity(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.IdentityFailureGrace <= 0 {
		c.IdentityFailureGrace = 60 * time.Second
	}
	if c.Addr == "" {
		c.Addr = ":8080"
	}
	if c.SessionDir == "" {
		c.SessionDir = "/data/claude"
		if _, err := os.Stat(c.SessionDir); err != nil {
			errs = append(errs, errors.New("set TALKIDE_SESSION_DIR: the default session volume /data/claude does not exist (mount the claude-sessions volume there)"))
		}
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
	if c.MinFreeDisk == 0 {
		c.MinFreeDisk = 256 << 20
	}
	if c.KeepEvents <= 0 {
		c.KeepEvents = 10000
	}
	if c.WorkerID == "" {
		c.WorkerID, _ = os.Hostname()
	}
	switch c.LeaseBackend {
	case "":
		c.LeaseBackend = "file"
	case "file", "kubernetes":
	default:
		errs = append(errs, fmt.Errorf("TALKIDE_LEASE_BACKEND %q: want file or kubernetes", c.LeaseBackend))
	}
	if c.MetricsToken != "" && len(c.MetricsToken) < 16 {
		errs = append(errs, errors.New("TALKIDE_METRICS_TOKEN: use at least 16 characters (e.g. openssl rand -hex 32)"))
	}
	procs := c.MaxProcesses
	if procs <= 0 {
		procs = 4 // the harness's default
	}
	if c.MaxProcessesPerUser < 0 || c.MaxProcessesPerUser > procs {
		errs = append(errs, fmt.Errorf("TALKIDE_MAX_PROCESSES_PER_USER %d: want 1 to TALKIDE_MAX_PROCESSES (%d)", c.MaxProcessesPerUser, procs))
	}
	if c.MaxConversations < 0 || c.MaxConversationsPerUser < 0 {
		errs = append(errs, errors.New("TALKIDE_MAX_CONVERSATIONS_PER_TENANT_ENV and TALKIDE_MAX_CONVERSATIONS_PER_USER: want positive integers"))
	}
	if err := c.validateContainment(); err != nil {
		errs = append(errs, err)
	}
	switch c.Builds.Mode {
	case "", BuildsKubernetes, BuildsLocal, BuildsOff:
	default:
		errs = append(errs, fmt.Errorf("TALKIDE_BUILDS %q: want kubernetes, local or off", c.Builds.Mode))
	}
	if c.Builds.Mode == BuildsKubernetes && c.Builds.Image == "" {
		errs = append(errs, errors.New("TALKIDE_BUILDS=kubernetes needs TALKIDE_BUILD_IMAGE, the Gradle builder image pinned by digest (make images builds talkide-builder-gradle)"))
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return errors.Join(errs...)
}

// newIdentity reads the identity token (IdentityToken or
// IdentityTokenFile) and checks that it is an unexpired identity token of
// this worker's tenant-env; the file is read again whenever it changes.
func (c *Config) newIdentity() (*localproxy.Identity, error) {
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	return localproxy.NewIdentity(localproxy.IdentityConfig{
		Token: c.IdentityToken, File: c.IdentityTokenFile, Tenant: c.Tenant, Env: c.Env,
		Logger: log.With("tenant", c.Tenant, "env", c.Env, "component", "identity"),
	})
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
