package controlplane

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/httpapi"
)

// conversationJSON is a conversation as the browser API shows it (GET
// /api/conversations, GET and PATCH /api/conversations/{id}).
type conversationJSON struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	Env    string `json:"env"`
	// Title is the user's name for it, else its first message, else "".
	Title string `json:"title"`
	// TitleSet is true when the user named it (PATCH).
	TitleSet       bool      `json:"title_set"`
	CreatedAt      time.Time `json:"created_at"`
	LastActivityAt time.Time `json:"last_activity_at"`
	// State is "running" while a turn is in progress, else "idle" (as far
	// as the worker's reports have come: they follow within seconds).
	State string `json:"state"`
	// PendingPermissions counts permission requests waiting for an answer.
	PendingPermissions int    `json:"pending_permissions"`
	SpentNanoUSD       int64  `json:"spent_nano_usd"`
	SpentUSD           string `json:"spent_usd"`
}

func toConversationJSON(s controlstore.ConversationSummary) conversationJSON {
	state := "idle"
	if s.Running {
		state = "running"
	}
	return conversationJSON{ID: s.ID, Tenant: s.Tenant, Env: s.Env, Title: s.Title, TitleSet: s.Named,
		CreatedAt: s.CreatedAt, LastActivityAt: s.LastActivity, State: state,
		PendingPermissions: s.PendingPermissions, SpentNanoUSD: s.SpentNano, SpentUSD: budget.FormatUSD(s.SpentNano)}
}

// conversationList is a page of GET /api/conversations.
type conversationList struct {
	Conversations []conversationJSON `json:"conversations"`
	// NextCursor continues the list (absent on the last page).
	NextCursor string `json:"next_cursor,omitempty"`
}

// renameRequest is the body of PATCH /api/conversations/{id}.
type renameRequest struct {
	Title *string `json:"title"`
}

// grantJSON is a tenant-env the user may work in.
type grantJSON struct {
	Tenant string `json:"tenant"`
	Env    string `json:"env"`
}

// meResponse answers GET /api/me.
type meResponse struct {
	User   string      `json:"user"`
	Grants []grantJSON `json:"grants"`
	Budget spendJSON   `json:"budget"`
}

// listConversations serves GET /api/conversations: the caller's live
// conversations, newest first, in pages (limit 1-100, default 20; cursor
// from next_cursor), optionally of one tenant and env.
func (s *Server) listConversations(w http.ResponseWriter, r *http.Request) error {
	u, err := s.user(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	if err := onlyParams(q, "tenant", "env", "limit", "cursor"); err != nil {
		return err
	}
	if err := tenantParam("tenant", q.Get("tenant")); err != nil {
		return err
	}
	if err := tenantParam("env", q.Get("env")); err != nil {
		return err
	}
	limit := 20
	if q.Has("limit") {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 1 || n > 100 {
			return httpapi.BadRequest("limit %q: want a whole number from 1 to 100", q.Get("limit"))
		}
		limit = n
	}
	page, next, err := s.db.ListConversations(r.Context(), controlstore.ConversationFilter{
		UserID: u.ID, Tenant: q.Get("tenant"), Env: q.Get("env"), Cursor: q.Get("cursor"), Limit: limit})
	if errors.Is(err, controlstore.ErrBadCursor) {
		return httpapi.BadRequest("cursor: not one this API gave (use next_cursor of the previous page)")
	}
	if err != nil {
		return err
	}
	resp := conversationList{Conversations: make([]conversationJSON, 0, len(page)), NextCursor: next}
	for _, c := range page {
		resp.Conversations = append(resp.Conversations, toConversationJSON(c))
	}
	httpapi.WriteJSON(w, http.StatusOK, resp)
	return nil
}

// renameConversation serves PATCH /api/conversations/{id} with
// {"title": "..."}: one line, at most 200 bytes once trimmed; "" goes back
// to the first message. It answers the conversation.
func (s *Server) renameConversation(w http.ResponseWriter, r *http.Request) error {
	u, err := s.user(r)
	if err != nil {
		return err
	}
	c, err := s.conversation(r, u)
	if err != nil {
		return err
	}
	body, err := httpapi.ReadBody(w, r, 4<<10)
	if err != nil {
		return err
	}
	var req renameRequest
	if err := httpapi.DecodeJSON(r, body, &req); err != nil {
		return err
	}
	if req.Title == nil {
		return httpapi.BadRequest(`give "title" (a string; "" goes back to the first message)`)
	}
	title, err := controlstore.CleanTitle(*req.Title)
	if err != nil {
		return httpapi.BadRequest("%v", err)
	}
	if err := s.db.RenameConversation(r.Context(), c.ID, title); errors.Is(err, controlstore.ErrNotFound) {
		return httpapi.NotFound("conversation not found")
	} else if err != nil {
		return err
	}
	sum, err := s.db.ConversationSummaryOf(r.Context(), c.ID)
	if errors.Is(err, controlstore.ErrNotFound) {
		return httpapi.NotFound("conversation not found")
	}
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, toConversationJSON(sum))
	return nil
}

// me serves GET /api/me[?tenant=T]: the caller, the tenant-envs they may
// use and their budget in this period (for calls through tenant T when
// given: a tenant's own limit applies to them; 403 for a tenant the caller
// has no grant in).
func (s *Server) me(w http.ResponseWriter, r *http.Request) error {
	u, err := s.user(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	if err := onlyParams(q, "tenant"); err != nil {
		return err
	}
	tenant := q.Get("tenant")
	if err := tenantParam("tenant", tenant); err != nil {
		return err
	}
	grants, err := s.db.Grants(r.Context(), u.ID)
	if err != nil {
		return err
	}
	resp := meResponse{User: u.ID, Grants: make([]grantJSON, 0, len(grants))}
	granted := tenant == ""
	for _, g := range grants {
		resp.Grants = append(resp.Grants, grantJSON{Tenant: g.Tenant, Env: g.Env})
		granted = granted || g.Tenant == tenant
	}
	if !granted {
		// A tenant's limit is its administrators' business: only its users
		// see how it applies to them.
		return httpapi.Forbidden("you have no access to tenant "+tenant, nil)
	}
	sp, err := s.budget.Spend(r.Context(), u.ID, tenant)
	if err != nil {
		return err
	}
	resp.Budget = toSpendJSON(sp, tenant, s.cfg.BudgetPeriod.End(time.Now()))
	httpapi.WriteJSON(w, http.StatusOK, resp)
	return nil
}
