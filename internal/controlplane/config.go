package controlplane

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/talkide/talkide/internal/budget"
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
	// ./talkide.db.
	DBPath string
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
	// ShutdownGrace bounds the graceful shutdown. Default 10 s.
	ShutdownGrace time.Duration
	Logger        *slog.Logger
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
		c.ShutdownGrace = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return errors.Join(errs...)
}

// ParseTenantEnvs parses "tenant/env,tenant/env".
func ParseTenantEnvs(s string) ([][2]string, error) {
	var out [][2]string
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		t, e, ok := strings.Cut(part, "/")
		if !ok || !validName(t) || !validName(e) {
			return nil, fmt.Errorf("parse %q: want tenant/env of [a-z0-9-]", part)
		}
		out = append(out, [2]string{t, e})
	}
	return out, nil
}

// validName checks a tenant or env name: a DNS label, since the worker
// namespace is "{tenant}-{env}".
func validName(s string) bool {
	if s == "" || len(s) > 30 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}
