// Command talkide-controlplane runs the control plane: the browser
// conversation API and SSE stream, the mint endpoint and the gateway-proxy.
// It also has operator commands (new-master-key, worker-credentials,
// revoke-identity, add-user); `talkide-controlplane help` lists them.
//
// Environment: see controlplane.Config and the README.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/mint"
	"github.com/talkide/talkide/internal/harden"
	"github.com/talkide/talkide/internal/token"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "talkide-controlplane:", err)
		if errors.As(err, new(*contract.ConfigError)) {
			os.Exit(contract.ExitConfig)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	// Non-dumpable: no other process of this user (an agent on the same
	// machine) can read the master key or API key through /proc.
	if err := harden.Process(); err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if handled, err := command(ctx, args, os.Stdout, log); handled {
		return err
	}
	cfg, err := configFromEnv(log)
	if err != nil {
		return &contract.ConfigError{Err: err}
	}
	return controlplane.Run(ctx, cfg, nil)
}

func configFromEnv(log *slog.Logger) (controlplane.Config, error) {
	cfg, err := readConfig(log)
	if err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// readConfig reads the control plane's settings from the environment,
// without defaults or cross-checks (Config.Validate).
func readConfig(log *slog.Logger) (controlplane.Config, error) {
	cfg := controlplane.Config{
		Addr:              os.Getenv("TALKIDE_HTTP_ADDR"),
		DBPath:            os.Getenv("TALKIDE_DB_PATH"),
		DatabaseURL:       os.Getenv("TALKIDE_DATABASE_URL"),
		AdminToken:        os.Getenv("TALKIDE_ADMIN_TOKEN"),
		APIKey:            os.Getenv("ANTHROPIC_API_KEY"),
		WorkerURLTemplate: os.Getenv("TALKIDE_WORKER_URL_TEMPLATE"),
		DevUserToken:      os.Getenv("TALKIDE_DEV_USER_TOKEN"),
		MetricsToken:      os.Getenv("TALKIDE_METRICS_TOKEN"),
		Logger:            log,
	}
	for name, dst := range map[string]*int{"TALKIDE_MAX_CONVERSATIONS_PER_USER": &cfg.MaxConversationsPerUser, "TALKIDE_MAX_CONVERSATIONS_PER_TENANT_ENV": &cfg.MaxConversationsPerTenantEnv} {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return cfg, fmt.Errorf("%s %q: want a positive integer", name, v)
			}
			*dst = n
		}
	}
	if v := os.Getenv("TALKIDE_MASTER_KEYS"); v != "" {
		keys, err := token.ParseKeys(v)
		if err != nil {
			return cfg, fmt.Errorf("TALKIDE_MASTER_KEYS: %w", err)
		}
		for _, k := range keys {
			cfg.MasterKeys = append(cfg.MasterKeys, token.MasterKey(k))
		}
	}
	if v := os.Getenv("TALKIDE_UPSTREAM_URL"); v != "" {
		u, err := url.Parse(v)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return cfg, fmt.Errorf("TALKIDE_UPSTREAM_URL %q: want an absolute URL", v)
		}
		cfg.Upstream = u
	}
	if v := os.Getenv("TALKIDE_DEFAULT_USER_LIMIT_USD"); v != "" {
		d, err := budget.ParseUSD(v)
		if err != nil || d <= 0 {
			return cfg, fmt.Errorf("TALKIDE_DEFAULT_USER_LIMIT_USD %q: want a positive number of dollars like 100 or 12.50", v)
		}
		cfg.DefaultUserLimit = d
	}
	if err := budgetFromEnv(&cfg); err != nil {
		return cfg, err
	}
	if v := os.Getenv("TALKIDE_SHUTDOWN_GRACE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return cfg, fmt.Errorf("TALKIDE_SHUTDOWN_GRACE %q: want a positive duration like 20s", v)
		}
		cfg.ShutdownGrace = d
	}
	for name, dst := range map[string]*[][2]string{"TALKIDE_DEV_GRANTS": &cfg.DevGrants, "TALKIDE_HEALTH_WORKERS": &cfg.HealthWorkers} {
		te, err := controlstore.ParseTenantEnvs(os.Getenv(name))
		if err != nil {
			return cfg, fmt.Errorf("%s: %w", name, err)
		}
		*dst = te
	}
	return cfg, provisionFromEnv(&cfg)
}

func workerCredentials(ctx context.Context, args []string, out io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet("worker-credentials", flag.ContinueOnError)
	tenant := fs.String("tenant", "", "tenant")
	env := fs.String("env", "", "env")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := controlstore.ParseTenantEnvs(*tenant + "/" + *env); err != nil {
		return fmt.Errorf("worker-credentials: -tenant and -env: %w", err)
	}
	cfg, err := configFromEnv(log)
	if err != nil {
		return &contract.ConfigError{Err: err}
	}
	db, err := controlplane.OpenDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	idTok, err := mint.New(db, cfg.MasterKeys[0], log).IssueIdentity(ctx, *tenant, *env, 0)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "TALKIDE_WORKER_IDENTITY_TOKEN=%s\n", idTok)
	fmt.Fprintf(out, "TALKIDE_WORKER_REQUEST_KEYS=%s\n", token.FormatKey(cfg.MasterKeys[0].Derive(token.PurposeWorkerRequest, *tenant, *env)))
	return nil
}

// budgetFromEnv reads the gateway's price table and the budget policy.
func budgetFromEnv(cfg *controlplane.Config) error {
	if path := os.Getenv("TALKIDE_PRICES_FILE"); path != "" {
		p, err := budget.LoadPriceTable(path)
		if err != nil {
			return fmt.Errorf("TALKIDE_PRICES_FILE: %w", err)
		}
		cfg.Prices = p
	}
	if v := os.Getenv("TALKIDE_UNKNOWN_MODEL"); v != "" {
		pol := budget.UnknownModelPolicy(v)
		if pol != budget.UnknownDearest && pol != budget.UnknownDeny {
			return fmt.Errorf("TALKIDE_UNKNOWN_MODEL %q: want deny or dearest", v)
		}
		if cfg.Prices == nil {
			cfg.Prices = budget.DefaultPrices()
		}
		cfg.Prices.Unknown = pol
	}
	period, err := budget.ParsePeriodKind(os.Getenv("TALKIDE_BUDGET_PERIOD"))
	if err != nil {
		return fmt.Errorf("TALKIDE_BUDGET_PERIOD: %w", err)
	}
	cfg.BudgetPeriod = period
	switch v := os.Getenv("TALKIDE_BUDGET_PREDICT"); v {
	case "", "on":
	case "off":
		cfg.NoBudgetPrediction = true
	default:
		return fmt.Errorf("TALKIDE_BUDGET_PREDICT %q: want on or off", v)
	}
	for name, dst := range map[string]*time.Duration{"TALKIDE_FAIR_USE_WINDOW": &cfg.FairUse.Window, "TALKIDE_RESERVATION_TTL": &cfg.ReservationTTL} {
		if v := os.Getenv(name); v != "" {
			if name == "TALKIDE_FAIR_USE_WINDOW" && (v == "0" || v == "off") {
				*dst = -1 // fair use off
				continue
			}
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return fmt.Errorf("%s %q: want a positive duration like 1m, or off", name, v)
			}
			*dst = d
		}
	}
	for name, dst := range map[string]*int64{"TALKIDE_FAIR_USE_MAX_REQUESTS": &cfg.FairUse.MaxRequests, "TALKIDE_FAIR_USE_MAX_TOKENS": &cfg.FairUse.MaxTokens} {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return fmt.Errorf("%s %q: want a count (0 for no limit)", name, v)
			}
			*dst = n
		}
	}
	return nil
}
