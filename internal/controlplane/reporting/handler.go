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
// come from it and from nothing else. A refused token is logged.
func (h *Handler) scope(r *http.Request) (Scope, error) {
	raw := r.Header.Get(contract.HeaderWorkerToken)
	if raw == "" {
		return Scope{}, httpapi.Unauthorized("missing X-Worker-Token", nil)
	}
	sc, err := h.check(raw)
	if err != nil {
		h.log.WarnContext(r.Context(), "reporting refused worker token", "token", token.Fingerprint(raw)) // the cause: on the error line
	}
	return sc, err
}

// check verifies one WorkerToken and returns its scope, or a 401 or 403
// *httpapi.Error. It logs nothing (a batch logs its refusals once).
func (h *Handler) check(raw string) (Scope, error) {
	c, err := h.verifier.Verify(raw)
	if err != nil {
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

// Batch serves POST contract.PathReportBatch. The request's own
// X-Worker-Token is checked before its body is read (a caller without one
// gets a 401 and costs nothing more); then each group's WorkerToken is
// checked on its own and must be of the same tenant-env (a refused token
// refuses its group only), each report is decoded and validated on its own
// (an invalid one is answered 400 and skipped), and the rest are stored in
// one transaction.
func (h *Handler) Batch() http.Handler {
	return h.handle(func(w http.ResponseWriter, r *http.Request) error {
		caller, err := h.scope(r)
		if err != nil {
			return err
		}
		body, err := httpapi.ReadBody(w, r, contract.MaxReportBatchBody)
		if err != nil {
			return err
		}
		var b contract.ReportBatch
		if err := httpapi.DecodeJSON(r, body, &b); err != nil {
			return err
		}
		n := 0
		for _, g := range b.Groups {
			n += len(g.Reports)
		}
		if len(b.Groups) == 0 || len(b.Groups) > contract.MaxReportBatchGroups || n > contract.MaxReportBatchReports {
			return httpapi.BadRequest("a batch holds 1-%d groups and at most %d reports", contract.MaxReportBatchGroups, contract.MaxReportBatchReports)
		}
		ack := contract.ReportBatchAck{Groups: make([]contract.ReportGroupAck, len(b.Groups))}
		type at struct{ group, report int }
		var items []BatchItem
		var where []at
		refused := 0
		for gi, g := range b.Groups {
			scope, err := h.check(g.WorkerToken)
			if err == nil && (scope.Tenant != caller.Tenant || scope.Env != caller.Env) {
				err = httpapi.Forbidden("worker token of another tenant-env than the request's", nil)
			}
			if err != nil {
				ack.Groups[gi] = groupRefused(err)
				refused++
				continue
			}
			ga := contract.ReportGroupAck{Status: http.StatusOK, Results: make([]contract.ReportResult, len(g.Reports))}
			for ri, rep := range g.Reports {
				it, err := batchItem(r, scope, rep)
				if err != nil {
					ga.Results[ri] = reportRefused(err)
					continue
				}
				items = append(items, it)
				where = append(where, at{gi, ri})
			}
			ack.Groups[gi] = ga
		}
		if refused > 0 { // one line per request, not per group
			h.log.WarnContext(r.Context(), "report batch: groups refused for their worker token", "refused", refused, "groups", len(b.Groups),
				"tenant", caller.Tenant, "env", caller.Env)
		}
		if len(items) > 0 {
			res, err := h.store.RecordBatch(r.Context(), items)
			if err != nil {
				return err
			}
			for i, rr := range res {
				out := &ack.Groups[where[i].group].Results[where[i].report]
				switch {
				case rr.Err != nil:
					if !errors.Is(rr.Err, ErrKeyReused) {
						h.log.ErrorContext(r.Context(), "store a batched report", "err", rr.Err)
					}
					*out = reportRefused(storeError(rr.Err))
				default:
					*out = contract.ReportResult{Status: http.StatusOK, Duplicate: rr.Duplicate}
				}
			}
		}
		httpapi.WriteJSON(w, http.StatusOK, ack)
		return nil
	})
}

// batchItem decodes and validates one batched report.
func batchItem(r *http.Request, sc Scope, rep contract.BatchedReport) (BatchItem, error) {
	path := contract.ReportKindPath(rep.Kind)
	if path == "" {
		return BatchItem{}, httpapi.BadRequest("kind must be %s, %s or %s", contract.ReportKindToolEvent, contract.ReportKindUsage, contract.ReportKindActivity)
	}
	it := BatchItem{Scope: sc, Hash: BodyHash(path, rep.Report)}
	var v validator
	switch rep.Kind {
	case contract.ReportKindToolEvent:
		it.ToolEvent = &contract.ToolEventReport{}
		v = it.ToolEvent
	case contract.ReportKindUsage:
		it.Usage = &contract.UsageReport{}
		v = it.Usage
	default:
		it.Activity = &contract.ActivityReport{}
		v = it.Activity
	}
	if err := httpapi.DecodeJSON(r, rep.Report, v); err != nil {
		return BatchItem{}, err
	}
	if err := v.Validate(); err != nil {
		return BatchItem{}, httpapi.BadRequest("%v", err)
	}
	return it, nil
}

// groupRefused and reportRefused turn an *httpapi.Error into a group's or
// a report's answer; any other error is a 500.
func groupRefused(err error) contract.ReportGroupAck {
	status, detail := errorDetail(err)
	return contract.ReportGroupAck{Status: status, Error: detail}
}

func reportRefused(err error) contract.ReportResult {
	status, detail := errorDetail(err)
	return contract.ReportResult{Status: status, Error: detail}
}

func errorDetail(err error) (int, *contract.ErrorDetail) {
	var he *httpapi.Error
	if errors.As(err, &he) {
		return he.Status, &contract.ErrorDetail{Type: he.Type, Message: he.Msg}
	}
	return http.StatusInternalServerError, &contract.ErrorDetail{Type: contract.ErrTypeInternal, Message: "the report could not be stored now; send it again"}
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
