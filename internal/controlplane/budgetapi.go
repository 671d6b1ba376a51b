package controlplane

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"math"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/controlplane/gateway"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/token"
)

// OpenDB opens the control-plane database cfg names: PostgreSQL when
// DatabaseURL is set, else SQLite at DBPath. It migrates the schema.
func OpenDB(ctx context.Context, cfg Config) (*controlstore.DB, error) {
	if cfg.DatabaseURL != "" {
		return controlstore.OpenPostgres(ctx, cfg.DatabaseURL, dbMaxConns)
	}
	db, err := controlstore.OpenSQLite(ctx, cfg.DBPath)
	if err == nil {
		db.SQL.SetMaxOpenConns(dbMaxConns) // its files fit the reserve (limits.go)
	}
	return db, err
}

// spendParts are the gateway-proxy, the UserBudgetService and the metrics
// registry of one control plane.
type spendParts struct {
	budget   *budget.Service
	gateway  *gateway.Handler
	registry *prometheus.Registry
	// files counts the process's sockets: the gateway's to the upstream,
	// and the server's and the worker clients' (NewServer, Run), against
	// the open-files budget Run sets (limits.go); unbounded until then.
	files *httpapi.Files
}

func newSpendParts(cfg Config, db *controlstore.DB) *spendParts {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	svc := budget.NewService(db, budget.Config{
		DefaultLimit: cfg.DefaultUserLimit, Period: cfg.BudgetPeriod, ReservationTTL: cfg.ReservationTTL,
		FairUse: cfg.FairUse, NoPrediction: cfg.NoBudgetPrediction, Logger: cfg.Logger.With("component", "budget"), Metrics: budget.NewMetrics(reg),
	})
	var gwKeys []token.Key
	for _, mk := range cfg.MasterKeys {
		gwKeys = append(gwKeys, mk.Derive(token.PurposeGateway, "", ""))
	}
	files := httpapi.NewFiles(math.MaxInt)
	gw := gateway.New(gateway.Config{
		Dial:     files.DialContext(&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}),
		Upstream: cfg.Upstream,
		APIKey:   cfg.APIKey,
		Keys:     gwKeys,
		Budget:   svc,
		Prices:   cfg.Prices,
		Metrics:  gateway.NewMetrics(reg),
		Logger:   cfg.Logger.With("component", "gateway"),
	})
	return &spendParts{budget: svc, gateway: gw, registry: reg, files: files}
}

// close waits for the gateway's pending debits, then stops the budget
// writer. Call it after the HTTP server stopped.
func (p *spendParts) close() {
	p.gateway.Close()
	p.budget.Close()
}

// register mounts the gateway-proxy, GET /metrics and the budget admin API.
func (p *spendParts) register(mux *http.ServeMux, cfg Config, log *slog.Logger) {
	mux.Handle(contract.PathGatewayPrefix+"/", p.gateway)
	a := &budgetAPI{svc: p.budget, log: log, period: cfg.BudgetPeriod, auth: adminAuth(cfg.AdminToken)}
	// The metrics name tenants and their spend: they need the metrics (or
	// the admin) token, from loopback too, where agents of the one-machine
	// run are clients as well.
	metrics := promhttp.HandlerFor(p.registry, promhttp.HandlerOpts{})
	mux.Handle("GET /metrics", httpapi.Handle(log, httpapi.MetricsAuth(metrics, cfg.MetricsToken, cfg.AdminToken)))
	h := func(f httpapi.HandlerFunc) http.Handler { return httpapi.Handle(log, a.auth(f)) }
	mux.Handle("GET /api/admin/budget/users/{user}", h(a.getUser))
	mux.Handle("PUT /api/admin/budget/users/{user}/limit", h(a.putUserLimit))
	mux.Handle("DELETE /api/admin/budget/users/{user}/limit", h(a.deleteUserLimit))
	mux.Handle("PUT /api/admin/budget/tenants/{tenant}/limit", h(a.putTenantLimit))
	mux.Handle("DELETE /api/admin/budget/tenants/{tenant}/limit", h(a.deleteTenantLimit))
	mux.Handle("GET /api/admin/budget/ledger", h(a.ledger))
}

// budgetAPI is the operator API over the UserBudgetService (docs/budget-admin-api.md).
type budgetAPI struct {
	svc *budget.Service
	log *slog.Logger
	// period is the kind of budget period (cfg.BudgetPeriod).
	period budget.PeriodKind
	auth   func(httpapi.HandlerFunc) httpapi.HandlerFunc
}

// periodEnd is when period p ends.
func (a *budgetAPI) periodEnd(p string) time.Time { return a.period.End(periodStart(a.period, p)) }

// adminAuth guards an operator API with the admin token (Authorization:
// Bearer <TALKIDE_ADMIN_TOKEN>): 403 when no token is configured, 401 for
// a missing or wrong one.
func adminAuth(adminToken string) func(httpapi.HandlerFunc) httpapi.HandlerFunc {
	var tokenHash []byte
	if adminToken != "" {
		sum := sha256.Sum256([]byte(adminToken))
		tokenHash = sum[:]
	}
	return func(next httpapi.HandlerFunc) httpapi.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) error {
			if tokenHash == nil {
				return httpapi.Forbidden("the admin API is disabled: set TALKIDE_ADMIN_TOKEN on the control plane", nil)
			}
			raw := httpapi.BearerToken(r)
			sum := sha256.Sum256([]byte(raw))
			if raw == "" || subtle.ConstantTimeCompare(sum[:], tokenHash) != 1 {
				return httpapi.Unauthorized("missing or wrong admin token (Authorization: Bearer <TALKIDE_ADMIN_TOKEN>)", nil)
			}
			return next(w, r)
		}
	}
}

// spendJSON is a user's position in a period; every amount is given in
// nano-USD (integer) and as decimal dollars (string).
type spendJSON struct {
	User             string `json:"user"`
	Tenant           string `json:"tenant,omitempty"`
	Period           string `json:"period"`
	LimitSource      string `json:"limit_source"`
	LimitNanoUSD     int64  `json:"limit_nano_usd"`
	LimitUSD         string `json:"limit_usd"`
	SpentNanoUSD     int64  `json:"spent_nano_usd"`
	SpentUSD         string `json:"spent_usd"`
	ReservedNanoUSD  int64  `json:"reserved_nano_usd"`
	ReservedUSD      string `json:"reserved_usd"`
	RemainingNanoUSD int64  `json:"remaining_nano_usd"`
	RemainingUSD     string `json:"remaining_usd"`
	// ResetsAt is when the period ends and spending starts again from 0.
	ResetsAt time.Time `json:"resets_at"`
}

func toSpendJSON(sp budget.Spend, tenant string, resets time.Time) spendJSON {
	return spendJSON{User: sp.UserID, Tenant: tenant, Period: sp.Period, LimitSource: string(sp.LimitSource),
		LimitNanoUSD: sp.Limit, LimitUSD: budget.FormatUSD(sp.Limit), SpentNanoUSD: sp.Spent, SpentUSD: budget.FormatUSD(sp.Spent),
		ReservedNanoUSD: sp.Reserved, ReservedUSD: budget.FormatUSD(sp.Reserved),
		RemainingNanoUSD: sp.Remaining(), RemainingUSD: budget.FormatUSD(sp.Remaining()), ResetsAt: resets}
}

func (a *budgetAPI) spend(r *http.Request, user string) (spendJSON, error) {
	q := r.URL.Query()
	if err := onlyParams(q, "tenant", "period"); err != nil {
		return spendJSON{}, err
	}
	tenant := q.Get("tenant")
	if err := tenantParam("tenant", tenant); err != nil {
		return spendJSON{}, err
	}
	var sp budget.Spend
	var err error
	if q.Has("period") {
		p := q.Get("period")
		if err := checkPeriod(a.period, p); err != nil {
			return spendJSON{}, err
		}
		sp, err = a.svc.SpendIn(r.Context(), user, tenant, p)
	} else {
		sp, err = a.svc.Spend(r.Context(), user, tenant)
	}
	if err != nil {
		return spendJSON{}, err
	}
	sp.UserID = user
	return toSpendJSON(sp, tenant, a.periodEnd(sp.Period)), nil
}

func (a *budgetAPI) getUser(w http.ResponseWriter, r *http.Request) error {
	user, err := userParam(r)
	if err != nil {
		return err
	}
	sp, err := a.spend(r, user)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, sp)
	return nil
}

// limitRequest sets a limit in decimal dollars or in nano-USD (one of them).
type limitRequest struct {
	LimitUSD     string `json:"limit_usd,omitempty"`
	LimitNanoUSD *int64 `json:"limit_nano_usd,omitempty"`
}

func readLimit(w http.ResponseWriter, r *http.Request) (budget.NanoUSD, error) {
	body, err := httpapi.ReadBody(w, r, 4<<10)
	if err != nil {
		return 0, err
	}
	var req limitRequest
	if err := httpapi.DecodeJSON(r, body, &req); err != nil {
		return 0, err
	}
	switch {
	case req.LimitUSD != "" && req.LimitNanoUSD != nil, req.LimitUSD == "" && req.LimitNanoUSD == nil:
		return 0, httpapi.BadRequest(`give exactly one of "limit_usd" (decimal dollars, e.g. "25.50") and "limit_nano_usd"`)
	case req.LimitNanoUSD != nil:
		if *req.LimitNanoUSD < 0 || *req.LimitNanoUSD > budget.MaxCost {
			return 0, httpapi.BadRequest("limit_nano_usd out of range")
		}
		return *req.LimitNanoUSD, nil
	}
	n, err := budget.ParseUSD(req.LimitUSD)
	if err != nil {
		return 0, httpapi.BadRequest("limit_usd: %v", err)
	}
	return n, nil
}

func (a *budgetAPI) putUserLimit(w http.ResponseWriter, r *http.Request) error {
	user, err := userParam(r)
	if err != nil {
		return err
	}
	limit, err := readLimit(w, r)
	if err != nil {
		return err
	}
	if err := a.svc.SetUserLimit(r.Context(), user, limit); err != nil {
		return err
	}
	a.log.InfoContext(r.Context(), "budget limit set", "user", user, "limit_nano_usd", limit)
	return a.getUser(w, r)
}

func (a *budgetAPI) deleteUserLimit(w http.ResponseWriter, r *http.Request) error {
	user, err := userParam(r)
	if err != nil {
		return err
	}
	if err := a.svc.ClearUserLimit(r.Context(), user); err != nil {
		return err
	}
	a.log.InfoContext(r.Context(), "budget limit cleared", "user", user)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

type tenantLimitJSON struct {
	Tenant       string `json:"tenant"`
	LimitNanoUSD int64  `json:"limit_nano_usd"`
	LimitUSD     string `json:"limit_usd"`
}

func (a *budgetAPI) putTenantLimit(w http.ResponseWriter, r *http.Request) error {
	tenant := r.PathValue("tenant")
	if err := tenantParam("tenant", tenant); err != nil {
		return err
	}
	limit, err := readLimit(w, r)
	if err != nil {
		return err
	}
	if err := a.svc.SetTenantLimit(r.Context(), tenant, limit); err != nil {
		return err
	}
	a.log.InfoContext(r.Context(), "tenant budget limit set", "tenant", tenant, "limit_nano_usd", limit)
	httpapi.WriteJSON(w, http.StatusOK, tenantLimitJSON{Tenant: tenant, LimitNanoUSD: limit, LimitUSD: budget.FormatUSD(limit)})
	return nil
}

func (a *budgetAPI) deleteTenantLimit(w http.ResponseWriter, r *http.Request) error {
	if err := tenantParam("tenant", r.PathValue("tenant")); err != nil {
		return err
	}
	if err := a.svc.ClearTenantLimit(r.Context(), r.PathValue("tenant")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *budgetAPI) ledger(w http.ResponseWriter, r *http.Request) error {
	lq, err := ledgerQuery(r.URL.Query())
	if err != nil {
		return err
	}
	entries, err := a.svc.Ledger(r.Context(), lq)
	if err != nil {
		return err
	}
	if entries == nil {
		entries = []budget.LedgerEntry{}
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"entries": entries})
	return nil
}
