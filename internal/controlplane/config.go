package controlplane

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/pgdsn"
	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/token"
)

// Config is the control plane's configuration, read from the environment by
// cmd/talkide-controlplane (names in brackets). Zero values take the defaults
// noted.
type Config struct {
	// Addr is the HTTP listen address [TALKIDE_HTTP_ADDR]. Default
	// 127.0.0.1:8080.
	Addr string
	// DBPath is the SQLite database file [TALKIDE_DB_PATH]. Default
	// ./talkide.db. Ignored when DatabaseURL is set.
	DBPath string
	// DatabaseURL, a postgres:// URL, puts all control-plane state in
	// PostgreSQL instead of SQLite [TALKIDE_DATABASE_URL]; several
	// control-plane replicas may share it.
	DatabaseURL string
	// AdminToken guards the operator API under /api/admin/ (Authorization:
	// Bearer <token>) [TALKIDE_ADMIN_TOKEN]. Empty disables that API.
	AdminToken string
	// Prices is the gateway's price table [TALKIDE_PRICES_FILE, a JSON file
	// in the format of budget/default_prices.json]. Default: the built-in
	// table. [TALKIDE_UNKNOWN_MODEL=deny|dearest] overrides its policy for
	// models it does not list.
	Prices *budget.PriceTable
	// BudgetPeriod is the spending-limit period [TALKIDE_BUDGET_PERIOD:
	// month, week or day]. Default month (UTC calendar month).
	BudgetPeriod budget.PeriodKind
	// FairUse is the per-user fair-use policy [TALKIDE_FAIR_USE_WINDOW (a Go
	// duration; "off" turns fair use off), TALKIDE_FAIR_USE_MAX_REQUESTS,
	// TALKIDE_FAIR_USE_MAX_TOKENS]. Defaults: a 1-minute window, 120 calls,
	// tokens unlimited. A negative Window is off.
	FairUse budget.FairUse
	// NoBudgetPrediction makes the gateway forward a call only after its
	// reservation is durable, instead of while it commits
	// [TALKIDE_BUDGET_PREDICT=off; default on].
	NoBudgetPrediction bool
	// ReservationTTL is how long an unsettled budget reservation lives
	// before it is charged in full [TALKIDE_RESERVATION_TTL]. Default 30m.
	ReservationTTL time.Duration
	// MasterKeys are the root secrets [TALKIDE_MASTER_KEYS,
	// "kid:base64url,..."]; the first signs, all verify (rotation). Required.
	MasterKeys []token.MasterKey
	// Upstream is the Anthropic-compatible API [TALKIDE_UPSTREAM_URL].
	// Default https://api.anthropic.com.
	Upstream *url.URL
	// APIKey is the Anthropic API key [ANTHROPIC_API_KEY]; only the control
	// plane holds it.
	APIKey string
	// WorkerURLTemplate locates a tenant-env's worker; {tenant} and {env} are
	// replaced [TALKIDE_WORKER_URL_TEMPLATE]. Default
	// http://talkide-worker.{tenant}-{env}.svc.cluster.local:8080.
	WorkerURLTemplate string
	// DefaultUserLimit is each user's monthly budget in nano-USD
	// [TALKIDE_DEFAULT_USER_LIMIT_USD, in dollars]. Default 100 USD.
	DefaultUserLimit budget.NanoUSD
	// DevUserToken, when set, creates user "dev" with this bearer token and
	// grants it DevGrants [TALKIDE_DEV_USER_TOKEN]. For the one-machine run.
	DevUserToken string
	// DevGrants are "tenant/env" pairs for the dev user [TALKIDE_DEV_GRANTS].
	// Default demo/dev.
	DevGrants [][2]string
	// HealthWorkers are "tenant/env" workers whose readiness /healthz
	// requires [TALKIDE_HEALTH_WORKERS].
	HealthWorkers [][2]string
	// MaxConversationsPerUser caps one user's live conversations in a
	// tenant-env [TALKIDE_MAX_CONVERSATIONS_PER_USER], and
	// MaxConversationsPerTenantEnv all users' there
	// [TALKIDE_MAX_CONVERSATIONS_PER_TENANT_ENV]: POST /api/conversations
	// beyond a cap is 429 rate_limited; a deleted conversation stops
	// counting. Defaults 100 and 1000.
	MaxConversationsPerUser, MaxConversationsPerTenantEnv int
	// MetricsToken is the bearer token GET /metrics requires
	// [TALKIDE_METRICS_TOKEN, at least 16 characters]; AdminToken is
	// accepted too. With neither set /metrics answers 403: metrics name
	// tenants and their spend, and on one machine the agents are loopback
	// clients as well.
	MetricsToken string
	// ShutdownGrace is how long requests in flight (gateway calls above
	// all) may go on after SIGTERM [TALKIDE_SHUTDOWN_GRACE, a Go duration];
	// calls still running then are cut. Default 20 s (keep it below the
	// pod's terminationGracePeriodSeconds).
	ShutdownGrace time.Duration
	// Provisioner turns worker provisioning on: "kubernetes" runs the
	// K8sWorkerProvisioner (admin API /api/admin/workers, its controller)
	// [TALKIDE_PROVISIONER]. Default off.
	Provisioner string
	// Provision configures the provisioner (see provision.Config for each
	// setting and its environment variable).
	Provision provision.Config
	// Kubeconfig is the cluster's kubeconfig file [KUBECONFIG]; empty: the
	// pod's in-cluster credentials.
	Kubeconfig string
	Logger     *slog.Logger
	// Middleware, when set, wraps the control plane's whole HTTP handler
	// (outermost): for a program that embeds the control plane and adds
	// its own observability or access control, and for tests that watch
	// the traffic. Not settable from the environment.
	Middleware func(http.Handler) http.Handler

	// provisionerCommand: an operator command (status, deprovision) that
	// needs no worker image.
	provisionerCommand bool
}

// ForProvisionerCommand turns the provisioner on for an operator command
// (provision, deprovision, status, rotate-identity) run outside the
// serving control plane; TALKIDE_WORKER_IMAGE is then needed only to
// provision.
func (c *Config) ForProvisionerCommand() {
	c.Provisioner, c.provisionerCommand = "kubernetes", true
}

// Validate applies defaults and checks c.
func (c *Config) Validate() error {
	var errs []error
	if len(c.MasterKeys) == 0 {
		errs = append(errs, errors.New("set TALKIDE_MASTER_KEYS (generate one with: talkide-controlplane new-master-key)"))
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:8080"
	}
	if c.DBPath == "" {
		c.DBPath = "talkide.db"
	}
	if c.DatabaseURL != "" && !controlstore.IsPostgresURL(c.DatabaseURL) {
		errs = append(errs, errors.New("TALKIDE_DATABASE_URL: want a postgres:// URL (leave it unset for SQLite at TALKIDE_DB_PATH)"))
	} else if c.DatabaseURL != "" {
		if err := pgdsn.CheckURL(c.DatabaseURL); err != nil {
			errs = append(errs, fmt.Errorf("TALKIDE_DATABASE_URL: %w", err))
		}
	}
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		errs = append(errs, errors.New("TALKIDE_ADMIN_TOKEN: use at least 16 characters (e.g. openssl rand -hex 32)"))
	}
	if c.MetricsToken != "" && len(c.MetricsToken) < 16 {
		errs = append(errs, errors.New("TALKIDE_METRICS_TOKEN: use at least 16 characters (e.g. openssl rand -hex 32)"))
	}
	if c.MaxConversationsPerUser < 0 || c.MaxConversationsPerTenantEnv < 0 {
		errs = append(errs, errors.New("TALKIDE_MAX_CONVERSATIONS_PER_USER and TALKIDE_MAX_CONVERSATIONS_PER_TENANT_ENV: want positive integers"))
	}
	if c.MaxConversationsPerUser == 0 {
		c.MaxConversationsPerUser = 100
	}
	if c.MaxConversationsPerTenantEnv == 0 {
		c.MaxConversationsPerTenantEnv = 1000
	}
	if c.Prices == nil {
		c.Prices = budget.DefaultPrices()
	}
	if c.BudgetPeriod == "" {
		c.BudgetPeriod = budget.Monthly
	}
	if c.FairUse.Window == 0 {
		c.FairUse.Window = time.Minute
	}
	if c.FairUse.Window > 0 && c.FairUse.MaxRequests == 0 && c.FairUse.MaxTokens == 0 {
		c.FairUse.MaxRequests = 120
	}
	if c.ReservationTTL <= 0 {
		c.ReservationTTL = 30 * time.Minute
	}
	if c.Upstream == nil {
		c.Upstream, _ = url.Parse("https://api.anthropic.com")
	}
	if c.WorkerURLTemplate == "" {
		c.WorkerURLTemplate = "http://talkide-worker.{tenant}-{env}.svc.cluster.local:8080"
	}
	if c.DefaultUserLimit <= 0 {
		c.DefaultUserLimit = 100 * 1_000_000_000
	}
	if c.DevUserToken != "" && len(c.DevGrants) == 0 {
		c.DevGrants = [][2]string{{"demo", "dev"}}
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = 20 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch c.Provisioner {
	case "":
	case "kubernetes":
		c.Provision.WorkerURLTemplate = c.WorkerURLTemplate
		c.Provision.Logger = c.Logger.With("component", "provisioner")
		if c.Provision.Image == "" && !c.provisionerCommand {
			errs = append(errs, errors.New("TALKIDE_WORKER_IMAGE: the worker image is required with TALKIDE_PROVISIONER=kubernetes"))
		}
		if err := c.Provision.Validate(); err != nil {
			errs = append(errs, err)
		}
	default:
		errs = append(errs, fmt.Errorf("TALKIDE_PROVISIONER %q: want kubernetes, or unset", c.Provisioner))
	}
	return errors.Join(errs...)
}

// validName checks a tenant or env name: a DNS label, since the worker
// namespace is "{tenant}-{env}" (provision.ValidName).
func validName(s string) bool { return provision.ValidName(s) }
