package reporting

import (
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
	"github.com/talkide/talkide/internal/token"
)

// Handler serves the worker reporting endpoints (contract.PathReport*).
// Each method returns the http.Handler of one route; package controlplane
// registers them.
type Handler struct {
	store    *Store
	verifier *token.Verifier
	log      *slog.Logger
}

// NewHandler returns the reporting endpoints over store, accepting
// WorkerTokens signed with any of keys (derived for token.PurposeGateway).
func NewHandler(store *Store, keys []token.Key, log *slog.Logger) *Handler {
	return &Handler{store: store, verifier: token.NewVerifier(token.PurposeGateway, keys...), log: log}
}

// scope authenticates the WorkerToken: tenant, env, conversation and user
// come from it and from nothing else.
func (h *Handler) scope(r *http.Request) (Scope, error) {
	raw := r.Header.Get(contract.HeaderWorkerToken)
	if raw == "" {
		return Scope{}, httpapi.Unauthorized("missing X-Worker-Token", nil)
	}
	c, err := h.verifier.Verify(raw)
	if err != nil {
		h.log.WarnContext(r.Context(), "reporting refused worker token", "token", token.Fingerprint(raw)) // the cause: on the error line
		return Scope{}, httpapi.Unauthorized("invalid or expired worker token", err)
	}
	if c.Conversation == "" || c.User == "" {
		return Scope{}, httpapi.Forbidden("worker token not scoped to a conversation", nil)
	}
	return Scope{Tenant: c.Tenant, Env: c.Env, Conversation: c.Conversation, User: c.User}, nil
}

// validator is a report body with a Validate method.
type validator interface{ Validate() error }

// read authenticates the request and decodes and validates its body into v.
// It returns the scope and the receipt hash of the request.
func (h *Handler) read(w http.ResponseWriter, r *http.Request, v validator) (Scope, string, error) {
	sc, err := h.scope(r)
	if err != nil {
		return Scope{}, "", err
	}
	body, err := httpapi.ReadBody(w, r, contract.MaxReportBody)
	if err != nil {
		return Scope{}, "", err
	}
	if err := httpapi.DecodeJSON(r, body, v); err != nil {
		return Scope{}, "", err
	}
	if err := v.Validate(); err != nil {
		return Scope{}, "", httpapi.BadRequest("%v", err)
	}
	return sc, BodyHash(r.URL.Path, body), nil
}

// storeError maps a Store error to an HTTP error.
func storeError(err error) error {
	switch {
	case errors.Is(err, ErrNotFound):
		return httpapi.NotFound("issue not found in this tenant-env")
	case errors.Is(err, ErrKeyReused):
		return httpapi.Wrap(http.StatusConflict, contract.ErrTypeConflict, "idempotency key already used for another report", err)
	}
	return err
}

func (h *Handler) handle(f httpapi.HandlerFunc) http.Handler { return httpapi.Handle(h.log, f) }

// ToolEvents serves POST contract.PathReportToolEvents.
func (h *Handler) ToolEvents() http.Handler {
	return h.handle(func(w http.ResponseWriter, r *http.Request) error {
		var rep contract.ToolEventReport
		sc, hash, err := h.read(w, r, &rep)
		if err != nil {
			return err
		}
		ack, err := h.store.RecordToolEvent(r.Context(), sc, rep, hash)
		return h.answer(w, ack, err)
	})
}

// Usage serves POST contract.PathReportUsage.
func (h *Handler) Usage() http.Handler {
	return h.handle(func(w http.ResponseWriter, r *http.Request) error {
		var rep contract.UsageReport
		sc, hash, err := h.read(w, r, &rep)
		if err != nil {
			return err
		}
		ack, err := h.store.RecordUsage(r.Context(), sc, rep, hash)
		return h.answer(w, ack, err)
	})
}

// Activity serves POST contract.PathReportActivity.
func (h *Handler) Activity() http.Handler {
	return h.handle(func(w http.ResponseWriter, r *http.Request) error {
		var rep contract.ActivityReport
		sc, hash, err := h.read(w, r, &rep)
		if err != nil {
			return err
		}
		ack, err := h.store.RecordActivity(r.Context(), sc, rep, hash)
		return h.answer(w, ack, err)
	})
}

// CreateIssue serves POST contract.PathReportIssues.
func (h *Handler) CreateIssue() http.Handler {
	return h.handle(func(w http.ResponseWriter, r *http.Request) error {
		var c contract.IssueCreate
		sc, hash, err := h.read(w, r, &c)
		if err != nil {
			return err
		}
		ack, err := h.store.CreateIssue(r.Context(), sc, c, hash)
		if err == nil && !ack.Duplicate {
			h.log.InfoContext(r.Context(), "issue filed", "tenant", sc.Tenant, "env", sc.Env, "conversation", sc.Conversation, "issue", ack.Issue.Number)
		}
		return h.answer(w, ack, err)
	})
}

// UpdateIssue serves POST contract.PathReportIssueUpdate.
func (h *Handler) UpdateIssue() http.Handler {
	return h.handle(func(w http.ResponseWriter, r *http.Request) error {
		n, err := IssueNumber(r.PathValue("number"))
		if err != nil {
			return err
		}
		var u contract.IssueUpdate
		sc, hash, err := h.read(w, r, &u)
		if err != nil {
			return err
		}
		ack, err := h.store.UpdateIssue(r.Context(), sc, n, u, hash)
		return h.answer(w, ack, err)
	})
}

// CommentIssue serves POST contract.PathReportIssueComment.
func (h *Handler) CommentIssue() http.Handler {
	return h.handle(func(w http.ResponseWriter, r *http.Request) error {
		n, err := IssueNumber(r.PathValue("number"))
		if err != nil {
			return err
		}
		var c contract.IssueComment
		sc, hash, err := h.read(w, r, &c)
		if err != nil {
			return err
		}
		ack, err := h.store.CommentIssue(r.Context(), sc, n, c, hash)
		return h.answer(w, ack, err)
	})
}

// ListIssues serves GET contract.PathReportIssues: the issues of the
// token's tenant-env (query state, before, limit as for the browser API).
func (h *Handler) ListIssues() http.Handler {
	return h.handle(func(w http.ResponseWriter, r *http.Request) error {
		sc, err := h.scope(r)
		if err != nil {
			return err
		}
		return ServeIssueList(w, r, h.store, sc.Tenant, sc.Env)
	})
}

// GetIssue serves GET contract.PathReportIssue.
func (h *Handler) GetIssue() http.Handler {
	return h.handle(func(w http.ResponseWriter, r *http.Request) error {
		sc, err := h.scope(r)
		if err != nil {
			return err
		}
		n, err := IssueNumber(r.PathValue("number"))
		if err != nil {
			return err
		}
		is, err := h.store.Issue(r.Context(), sc.Tenant, sc.Env, n)
		if err != nil {
			return storeError(err)
		}
		httpapi.WriteJSON(w, http.StatusOK, is)
		return nil
	})
}

func (h *Handler) answer(w http.ResponseWriter, v any, err error) error {
	if err != nil {
		return storeError(err)
	}
	httpapi.WriteJSON(w, http.StatusOK, v)
	return nil
}

// IssueNumber parses an issue number path element (1 … 2^53).
func IssueNumber(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 || n > 1<<53 {
		return 0, httpapi.NotFound("issue not found in this tenant-env")
	}
	return n, nil
}

// ServeIssueList answers a list of (tenant, env)'s issues filtered by the
// query parameters state (open, closed or all; default all), before (an
// issue number: only older issues) and limit (1–200, default 50).
func ServeIssueList(w http.ResponseWriter, r *http.Request, store *Store, tenant, env string) error {
	q := r.URL.Query()
	state := q.Get("state")
	switch state {
	case "":
		state = StateAll
	case contract.IssueOpen, contract.IssueClosed, StateAll:
	default:
		return httpapi.BadRequest("state must be open, closed or all")
	}
	var before int64
	if v := q.Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return httpapi.BadRequest("before must be an issue number")
		}
		before = n
	}
	limit := 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxIssueLimit {
			return httpapi.BadRequest("limit must be 1-%d", MaxIssueLimit)
		}
		limit = n
	}
	issues, err := store.ListIssues(r.Context(), tenant, env, state, before, limit)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, contract.IssueList{Issues: issues})
	return nil
}
