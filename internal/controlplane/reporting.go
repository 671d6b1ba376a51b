package controlplane

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/reporting"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/token"
)

// registerReporting adds the worker reporting endpoints
// (/api/internal/worker/*, authenticated with WorkerTokens) and the browser
// routes that read what workers reported.
func (s *Server) registerReporting() {
	var keys []token.Key
	for _, mk := range s.cfg.MasterKeys {
		keys = append(keys, mk.Derive(token.PurposeGateway, "", ""))
	}
	store := reporting.NewStore(s.db)
	rep := reporting.NewHandler(store, keys, s.log.With("component", "reporting"))
	s.mux.Handle("POST "+contract.PathReportToolEvents, rep.ToolEvents())
	s.mux.Handle("POST "+contract.PathReportUsage, rep.Usage())
	s.mux.Handle("POST "+contract.PathReportActivity, rep.Activity())
	s.mux.Handle("POST "+contract.PathReportBatch, rep.Batch())
	s.mux.Handle("POST "+contract.PathReportIssues, rep.CreateIssue())
	s.mux.Handle("GET "+contract.PathReportIssues, rep.ListIssues())
	s.mux.Handle("GET "+contract.PathReportIssue, rep.GetIssue())
	s.mux.Handle("POST "+contract.PathReportIssueUpdate, rep.UpdateIssue())
	s.mux.Handle("POST "+contract.PathReportIssueComment, rep.CommentIssue())

	h := func(f httpapi.HandlerFunc) http.Handler { return httpapi.Handle(s.log, f) }
	s.mux.Handle("GET /api/tenants/{tenant}/envs/{env}/issues", h(func(w http.ResponseWriter, r *http.Request) error {
		tenant, env, err := s.grantedTenantEnv(r)
		if err != nil {
			return err
		}
		return reporting.ServeIssueList(w, r, store, tenant, env)
	}))
	s.mux.Handle("GET /api/tenants/{tenant}/envs/{env}/issues/{number}", h(func(w http.ResponseWriter, r *http.Request) error {
		tenant, env, err := s.grantedTenantEnv(r)
		if err != nil {
			return err
		}
		n, err := reporting.IssueNumber(r.PathValue("number"))
		if err != nil {
			return err
		}
		is, err := store.Issue(r.Context(), tenant, env, n)
		if err != nil {
			if errors.Is(err, reporting.ErrNotFound) {
				return httpapi.NotFound("issue not found")
			}
			return err
		}
		httpapi.WriteJSON(w, http.StatusOK, is)
		return nil
	}))
	s.mux.Handle("GET /api/conversations/{id}/activity", h(func(w http.ResponseWriter, r *http.Request) error {
		u, err := s.user(r)
		if err != nil {
			return err
		}
		c, err := s.conversation(r, u) // the owner only; others get 404
		if err != nil {
			return err
		}
		q := r.URL.Query()
		var after int64
		if v := q.Get("after"); v != "" {
			if after, err = strconv.ParseInt(v, 10, 64); err != nil || after < 0 {
				return httpapi.BadRequest("after must be an event id")
			}
		}
		limit := 0
		if v := q.Get("limit"); v != "" {
			if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > reporting.MaxActivity {
				return httpapi.BadRequest("limit must be 1-%d", reporting.MaxActivity)
			}
		}
		act, err := store.Activity(r.Context(), c.ID, after, limit)
		if err != nil {
			return err
		}
		httpapi.WriteJSON(w, http.StatusOK, act)
		return nil
	}))
}

// grantedTenantEnv authenticates the browser user and checks their grant
// on the path's tenant-env (403 without one).
func (s *Server) grantedTenantEnv(r *http.Request) (tenant, env string, err error) {
	u, err := s.user(r)
	if err != nil {
		return "", "", err
	}
	tenant, env = r.PathValue("tenant"), r.PathValue("env")
	if !validName(tenant) || !validName(env) {
		return "", "", httpapi.NotFound("no such tenant-env")
	}
	ok, err := s.db.HasGrant(r.Context(), u.ID, tenant, env)
	if err != nil {
		return "", "", err
	}
	if !ok {
		return "", "", httpapi.Forbidden("you have no access to "+tenant+"/"+env, nil)
	}
	return tenant, env, nil
}
